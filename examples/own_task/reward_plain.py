"""An asyncrl-signature reward for the JSONL variant of examples/own_task
(``task.reward_fn=examples/own_task/reward_plain.py:score``).

asyncrl calls ``fn(prompt, completion, **fields)`` with every column of the record other than
the prompt as a keyword (here ``answer``, also passed as ``ground_truth``), and tells this
signature from verl's by the absence of a ``solution_str`` parameter (docs/rewards.md).
"""

from __future__ import annotations

import re

_DIGITS = re.compile(r"\d+")


def score(prompt: str, completion: str, answer: str, **fields) -> float:
    """1.0 for the exact sum; for digits only, the fraction of digits right aligned on the
    units (a gradient for the tiny demo model); anything else 0.0."""
    pred = completion.strip()
    if pred == answer:
        return 1.0
    if not _DIGITS.fullmatch(pred):
        return 0.0
    hits = sum(p == t for p, t in zip(reversed(pred), reversed(answer), strict=False))
    return hits / max(len(pred), len(answer))
