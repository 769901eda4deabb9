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
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

SPLITS = ("train", "eval")
DIGIT_WEIGHTS = (0.40, 0.35, 0.15, 0.07, 0.03)
"""Probability that an operand has 1, 2, 3, 4, 5 digits (independently per operand)."""
EVAL_FRACTION = 0.1
"""Fraction of the problem space held out for the eval split."""
REWARD_SPEC = "actors.rewards:addition_reward"
"""The reward function that scores this task's completions."""


@dataclass(frozen=True)
class Prompt:
    """One task instance: ``text`` is fed to the model, ``fields`` to the reward function."""

    index: int
    """Position in its source's stream (the cursor value that produced it)."""
    text: str
    """Prompt text, e.g. ``"27+5="``."""
    fields: dict = field(default_factory=dict)
    """JSON-serialisable extras passed to ``compute_score(prompt, completion, **fields)``;
    always contains ``"answer"`` (the exact expected completion text, without EOS)."""


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
