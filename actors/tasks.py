"""Prompt sources: deterministic, indexable streams of task prompts.

The demo task is integer addition, ``"a+b="`` -> ``"<a+b>"`` then EOS, where each operand has a
variable number of digits drawn from a skewed distribution (``DIGIT_WEIGHTS``: mostly 1-2
digits, a tail up to 5). Answers therefore range from 1 to 6 characters with a long tail, so
groups finish at different times, which is what asynchronous generation is for. The reward is
``actors.rewards:addition_reward`` (fraction of digits right, aligned on the units; exact = 1.0).

Invariants:

- ``PromptSource(seed, split).get(i)`` is a pure function of ``(seed, split, i)`` and of the
  task parameters: the same index always yields the same prompt, in any process (no global RNG,
  no ``hash()``), so a restarted actor resumes its cursor without skipping or repeating.
- The ``train`` and ``eval`` splits never share a problem: every unordered pair ``{a, b}`` belongs
  to exactly one split, decided by a hash of the pair that does not depend on ``seed``.

The task registry (``TASKS``, the values ``task.name`` takes): ``addition`` (this module) and
``file`` (prompts from dataset files: actors/file_source.py). ``build_prompt_source(cfg,
model_dir)`` builds the configured one; every source has ``get(index) -> Prompt`` (a pure
function of the index), ``end`` (the first index past its data; None = endless) and
``epoch_of(index)``.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from pathlib import Path

from actors.prompt import Prompt

SPLITS = ("train", "eval")
DIGIT_WEIGHTS = (0.40, 0.35, 0.15, 0.07, 0.03)
"""Probability that an operand has 1, 2, 3, 4, 5 digits (independently per operand)."""
EVAL_FRACTION = 0.1
"""Fraction of the problem space held out for the eval split."""
REWARD_SPEC = "actors.rewards:addition_reward"
"""The reward function that scores this task's completions."""


def _in_eval_split(a: int, b: int, eval_fraction: float) -> bool:
    """Whether the unordered problem ``{a, b}`` is held out (same answer for ``b, a``)."""
    lo, hi = sorted((a, b))
    digest = hashlib.sha256(f"{lo}+{hi}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < eval_fraction


def _draw_operand(rng: random.Random, digit_weights: tuple[float, ...]) -> int:
    """A non-negative integer with ``d`` digits, ``d`` drawn from ``digit_weights``."""
    digits = rng.choices(range(1, len(digit_weights) + 1), weights=digit_weights)[0]
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(low, 10**digits - 1)


class PromptSource:
    """Addition prompts ``"a+b="`` indexed by a deterministic cursor.

    ``get(i)`` is random access; ``next()`` returns ``get(cursor)`` and advances ``cursor``.
    Save ``cursor`` with a checkpoint and pass it back as ``start`` to resume exactly.
    """

    def __init__(
        self,
        seed: int = 0,
        split: str = "train",
        digit_weights: tuple[float, ...] = DIGIT_WEIGHTS,
        eval_fraction: float = EVAL_FRACTION,
        start: int = 0,
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if not digit_weights or min(digit_weights) < 0 or sum(digit_weights) <= 0:
            raise ValueError(
                f"digit_weights must be non-negative and not all zero: {digit_weights}"
            )
        if not 0.0 < eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        self.seed = seed
        self.split = split
        self.digit_weights = tuple(digit_weights)
        self.eval_fraction = eval_fraction
        self.cursor = start

    end = None
    """Endless: every index ``>= 0`` has a prompt."""

    @classmethod
    def from_config(cls, cfg, model_dir: str = "", log=print) -> PromptSource:
        """The RL stream of ``cfg`` (the ``train`` split, seeded by ``task.seed``)."""
        return cls(cfg.task.seed, split="train")

    def epoch_of(self, index: int) -> int:
        return 0

    def get(self, index: int) -> Prompt:
        """The prompt at ``index`` (``index >= 0``); a pure function of the source's settings."""
        if index < 0:
            raise ValueError(f"index must be >= 0, got {index}")
        # A string seed is hashed with SHA-512 by `random`: stable across processes and runs.
        rng = random.Random(f"addition:{self.seed}:{self.split}:{index}")
        want_eval = self.split == "eval"
        while True:  # rejection sampling into this split; terminates with probability 1
            a = _draw_operand(rng, self.digit_weights)
            b = _draw_operand(rng, self.digit_weights)
            if _in_eval_split(a, b, self.eval_fraction) == want_eval:
                break
        return Prompt(index=index, text=f"{a}+{b}=", fields={"a": a, "b": b, "answer": str(a + b)})

    def next(self) -> Prompt:
        """Return the prompt at ``cursor`` and advance the cursor by one."""
        prompt = self.get(self.cursor)
        self.cursor += 1
        return prompt

    def batch(self, start: int, count: int) -> list[Prompt]:
        """Prompts ``start .. start + count - 1`` (does not move the cursor)."""
        return [self.get(i) for i in range(start, start + count)]


def _file_source(cfg, model_dir: str, log=print):
    from actors.file_source import FileSource

    return FileSource.from_config(cfg, model_dir, log)


TASKS: dict[str, Callable] = {"addition": PromptSource.from_config, "file": _file_source}
"""``task.name`` -> ``factory(cfg, model_dir, log)``; asyncrl/config.py ``_TASKS`` repeats the
names (it imports no actor code) and tests/unit/test_config.py checks they match."""


def build_prompt_source(cfg, model_dir: str, log: Callable[[str], None] = print):
    """The prompt source ``task.name`` names, built for the model in ``model_dir``, after
    checking that prompts and responses fit the model's context. Raises
    ``actors.datafile.DataError`` naming the key and the fix for any unusable input."""
    check_context(cfg, model_dir)
    if cfg.task.name not in TASKS:  # the config refuses it first; this is the seam's own check
        raise ValueError(f"task.name={cfg.task.name!r}; known tasks: {', '.join(TASKS)}")
    return TASKS[cfg.task.name](cfg, model_dir, log)


def max_model_len(cfg) -> int:
    """vLLM's ``max_model_len``: the longest prompt kept plus the longest response."""
    return cfg.data.max_prompt_length + cfg.actor.max_tokens


def check_context(cfg, model_dir: str) -> None:
    """``max_model_len(cfg)`` must fit the model's context (``max_position_embeddings`` in its
    config.json, or its ``text_config``'s); a config without it is left to vLLM's own check."""
    from actors.datafile import DataError

    path = Path(model_dir) / "config.json"
    try:
        mc = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # the launcher checks the model directory itself (asyncrl/jobs.py)
    context = mc.get("max_position_embeddings") or (mc.get("text_config") or {}).get(
        "max_position_embeddings"
    )
    if isinstance(context, int) and max_model_len(cfg) > context:
        raise DataError(
            f"data.max_prompt_length={cfg.data.max_prompt_length} + actor.max_tokens="
            f"{cfg.actor.max_tokens} = {max_model_len(cfg)} tokens exceeds the model's context "
            f"(max_position_embeddings={context} in {path}); lower data.max_prompt_length or "
            "actor.max_tokens"
        )


def example_fields(cfg) -> dict:
    """The reward fields of the task's first record (no tokenizer needed), for checking the
    reward function's signature before the model is built."""
    if cfg.task.name != "file":
        return TASKS[cfg.task.name](cfg, "").get(0).fields
    from actors.datafile import DataKeys, read_rows

    d = cfg.data
    keys = DataKeys(d.prompt_key, d.answer_key, d.data_source_key, d.extra_info_key)
    return read_rows(d.train_files[:1], keys)[0].fields if d.train_files else {}


def check_data(cfg, model_dir: str, log: Callable[[str], None] = print) -> None:
    """Load the task's prompts as an actor will (and ``data.val_files``), so bad input fails
    before any process starts; say how far the data goes in learner steps."""
    source = build_prompt_source(cfg, model_dir, log)
    if cfg.data.val_files:
        from actors.file_source import FileSource

        FileSource.from_config(cfg, model_dir, log, split="val")
    if source.end is None:
        return
    from actors.datafile import DataError

    steps, b = source.end // cfg.learner.batch_groups, cfg.learner.batch_groups
    if steps == 0:
        raise DataError(
            f"data.train_files: {source.size} prompts x data.epochs={cfg.data.epochs} make "
            f"{source.end} groups, fewer than one learner step (learner.batch_groups={b}); "
            "give more data or epochs, or lower learner.batch_groups"
        )
    if steps < cfg.learner.steps:
        log(
            f"the data makes {source.end} groups, enough for at most {steps} of learner.steps="
            f"{cfg.learner.steps} steps (batch_groups={b}): the run ends when it runs out"
        )
