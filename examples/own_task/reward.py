"""A verl-style reward for examples/own_task (``task.reward_fn=.../reward.py:compute_score``).

asyncrl recognises verl's signature by its ``solution_str`` parameter and calls it with the
record's ``data_source``, the completion, ``reward_model.ground_truth`` (``data.answer_key`` in
``data=verl``) and ``extra_info`` (docs/rewards.md). Any verl ``compute_score`` file works the
same way.
"""

from __future__ import annotations

import re

_DIGITS = re.compile(r"\d+")


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Score one completion of an addition prompt on [0, 1].

    ``{"score": 1.0, "acc": True}`` when the completion (whitespace stripped) is exactly
    ``ground_truth``; otherwise ``acc`` is False and ``score`` is partial credit: for a
    completion of digits only, the fraction of digits that match the answer aligned on the
    right (units with units), divided by the longer length; anything else scores 0.0. The
    partial credit gives the tiny demo model a gradient before it finds exact sums. ``acc``
    reaches metrics.jsonl as ``reward/acc`` (the mean over a step's samples).
    """
    pred, target = solution_str.strip(), str(ground_truth).strip()
    if pred == target:
        return {"score": 1.0, "acc": True}
    if not _DIGITS.fullmatch(pred):
        return {"score": 0.0, "acc": False}
    hits = sum(p == t for p, t in zip(reversed(pred), reversed(target), strict=False))
    return {"score": hits / max(len(pred), len(target)), "acc": False}
