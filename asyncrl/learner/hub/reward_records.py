"""What a sample's reward fields say, read by both roles: the actor writes them
(actors/rewards/calls.py ``score_call``), the learner sums them (learner/hub/totals.py, learner/hub/hub.py).

``Sample.reward_error`` is ``""`` or ``"<kind>: <message>"`` with ``<kind>`` one of
``REWARD_ERROR_KINDS``; ``Sample.reward_extras`` holds a dict reward's other numeric values.
Core, so the learner reads them without importing the actors (docs/architecture.md, layers).
"""

from __future__ import annotations

from collections.abc import Iterable

REWARD_ERROR_KINDS = (
    "raised",
    "wrong_type",
    "missing_score",
    "non_finite",
    "out_of_range",
    "timeout",
    "crashed",
)
"""Why a reward call failed: it raised; returned something not a number (a string, None, a
bool); returned a dict without ``"score"``; returned NaN or an infinity; returned a number
beyond +-``asyncrl.core.types.MAX_ABS_REWARD``; ran past ``task.reward_timeout_s``; its worker
process died during the call (``asyncrl.actors.rewards.pool``)."""


def error_kind(reason: str) -> str:
    """The kind of a ``Sample.reward_error`` (``""`` for none; ``"other"`` for a reason not
    written by ``score_call``, e.g. by an older actor)."""
    if not reason:
        return ""
    kind = reason.partition(":")[0]
    return kind if kind in REWARD_ERROR_KINDS else "other"


def extras_means(samples: Iterable) -> dict[str, float]:
    """``{"reward/<key>": mean}`` of the samples' ``reward_extras``, each key averaged over the
    samples that have it (a failed call has none), sorted by key: the learner's per-step
    log."""
    sums: dict[str, list[float]] = {}
    for s in samples:
        for key, value in s.reward_extras.items():
            acc = sums.setdefault(key, [0.0, 0])
            acc[0] += value
            acc[1] += 1
    return {f"reward/{k}": total / n for k, (total, n) in sorted(sums.items())}


class RewardErrorTally:
    """Reward errors over some samples: ``{"count", "samples", "by_kind", "first"}``, where
    ``first`` is ``{"kind", "reason", "group_id"}`` of the first error (null if none). The
    learner's account (summary.json ``reward_errors``) of the samples it trained."""

    def __init__(self, saved: dict | None = None) -> None:
        saved = saved or {}
        self.count = int(saved.get("count", 0))
        self.samples = int(saved.get("samples", 0))
        self.by_kind: dict[str, int] = dict(saved.get("by_kind", {}))
        self.first: dict | None = saved.get("first")

    def add(self, reason: str, group_id: str = "") -> None:
        """One sample's ``reward_error`` ("" = scored fine)."""
        self.samples += 1
        if not reason:
            return
        kind = error_kind(reason)
        self.count += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        if self.first is None:
            self.first = {"kind": kind, "reason": reason, "group_id": group_id}

    def to_dict(self) -> dict:
        return {
            "count": self.count,
            "samples": self.samples,
            "by_kind": dict(sorted(self.by_kind.items())),
            "first": self.first,
        }
