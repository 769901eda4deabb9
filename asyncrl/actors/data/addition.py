"""The demo task: integer addition prompts and their reward, in one module.

The demo task is integer addition, ``"a+b="`` -> ``"<a+b>"`` then EOS, where each operand has a
variable number of digits drawn from a skewed distribution (``DIGIT_WEIGHTS``: mostly 1-2
digits, a tail up to 5). Answers therefore range from 1 to 6 characters with a long tail, so
groups finish at different times, which is what asynchronous generation is for. The reward is
``addition_reward`` below (fraction of digits right, aligned on the units; exact = 1.0).

Invariants:

- ``AdditionSource(seed, split).get(i)`` is a pure function of ``(seed, split, i)`` and of the
  task parameters: the same index always yields the same prompt, in any process (no global RNG,
  no ``hash()``), so a restarted actor resumes its cursor without skipping or repeating.
- The ``train`` and ``eval`` splits never share a problem: every unordered pair ``{a, b}`` belongs
  to exactly one split, decided by a hash of the pair that does not depend on ``seed``.
"""

from __future__ import annotations

import hashlib
import random
import re

from asyncrl.actors.data.prompt import Prompt

SPLITS = ("train", "eval")
DIGIT_WEIGHTS = (0.40, 0.35, 0.15, 0.07, 0.03)
"""Probability that an operand has 1, 2, 3, 4, 5 digits (independently per operand)."""
EVAL_FRACTION = 0.1
"""Fraction of the problem space held out for the eval split."""
REWARD_SPEC = "asyncrl.actors.data.addition:addition_reward"
"""The reward function that scores this task's completions."""
CHAT_QUESTION = "what is {a}+{b}? answer with the number only."
"""The user message of the demo model's chat-formatted SFT examples
(asyncrl/orchestration/demo/warmstart.py; examples/own_task/make_data.py asks the same), so the
demo model, like a real instruct model, knows its chat template; the multi-turn demo
(asyncrl/actors/data/chain.py) asks it too."""


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


class AdditionSource:
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
    def from_config(cls, cfg, model_dir: str = "", log=print, split="train") -> AdditionSource:
        """The RL stream of ``cfg`` (``split="train"``, seeded by ``task.seed``) or its
        validation prompts (``"val"``: the ``eval`` split)."""
        return cls(cfg.task.seed, split="eval" if split == "val" else "train")

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


ADDITION_PARTIAL_WEIGHT = 1.0
"""Scale of the per-digit credit of a wrong addition answer (``weight * matching / max(len)``).

1.0 (the reward is the fraction of digits right, exact match 1.0) was picked with
``benchmarks.demo.bare_grpo``: this dense reward learned ~1.5x faster than 0.5 and far faster than
exact-match only, because groups rarely tie and advantages rank partial answers."""
_DIGITS = re.compile(r"[0-9]+")


def addition_reward(prompt: str, completion: str, answer: str | None = None, **fields) -> float:
    """Demo-task reward on [0, 1]: 1.0 for the exact sum, else credit per correct digit.

    The completion (surrounding whitespace ignored) must be digits only, otherwise 0.0 (this is
    what teaches the model to stop: a rambling completion that hits ``max_tokens`` earns
    nothing). Digits are compared aligned on the right (units with units) and the score is
    ``ADDITION_PARTIAL_WEIGHT * matching / max(len(pred), len(answer))``, so too-long or
    too-short answers lose credit. ``answer`` defaults to the sum parsed from ``"a+b="``.
    """
    target = answer if answer is not None else _sum_from_prompt(prompt)
    pred = completion.strip()
    if pred == target:
        return 1.0
    if not _DIGITS.fullmatch(pred):
        return 0.0
    hits = sum(p == t for p, t in zip(reversed(pred), reversed(target), strict=False))
    return ADDITION_PARTIAL_WEIGHT * hits / max(len(pred), len(target))


def _sum_from_prompt(prompt: str) -> str:
    """``"12+30="`` -> ``"42"``; raises ``ValueError`` for anything else."""
    m = re.fullmatch(r"\s*(\d+)\s*\+\s*(\d+)\s*=\s*", prompt)
    if not m:
        raise ValueError(f"not an addition prompt and no 'answer' field: {prompt!r}")
    return str(int(m.group(1)) + int(m.group(2)))
