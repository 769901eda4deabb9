"""The learner's per-step check of the buffer's conservation law (rank 0, learner/hub/hub.py).

Law (``ReplayBuffer`` docstring), for the groups that came through ``commit``::

    committed == trained + dropped_stale + dropped_invalid + dropped_poison + dropped_uniform
                 + still_buffered

``ReplayBuffer.audit()`` reads every term in one round trip and returns the difference as
``imbalance`` (``committed`` minus the right-hand side). Every script keeps it at 0, so a
difference means something outside the job changed the counters (``N:stats``) or deleted
entries (``N``). Training is unaffected: the groups a step trains are checked one by one
(codec, commit record, staleness) and damage that would mislead training raises
``BufferDamaged`` instead. So an imbalance warns, once when it appears and again when it
changes or clears, and summary.json's ``ledger`` block says whether it balanced at the end
(``balanced``, ``imbalance``), when it first did not and for how many steps, rather than
printing totals that do not add up; it also lists the buffer's repairs of outside damage.
"""

from __future__ import annotations

from collections.abc import Sequence

from asyncrl.buffer.redis_buffer import TERMINAL_STATES


def describe(audit: dict) -> str:
    """``committed C != trained T + ... + still buffered B (= S)`` for an ``audit()`` dict."""
    terms = " + ".join(f"{k} {audit[k]}" for k in TERMINAL_STATES)
    accounted = audit["committed"] - audit["imbalance"]
    op = "==" if audit["imbalance"] == 0 else "!="
    return (
        f"committed {audit['committed']} {op} {terms} + still buffered "
        f"{audit['still_buffered']} (= {accounted})"
    )


class LedgerWatch:
    """Remembers what the learner has reported about the ledger; saved in checkpoints
    (``to_dict``) so a resumed run's summary still says the ledger once did not balance."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.imbalance = 0
        """The difference at the last check (0: balanced)."""
        self.foreign = 0
        """Entries commit() did not add, unread at the last check (not groups yet)."""
        self.first_step: int | None = None
        self.imbalanced_steps = 0
        self.repairs: list[str] = []
        self._repairs_seen = 0

    def restore(self, saved: dict | None) -> None:
        """Continue from a checkpoint's ``to_dict()``; the next check reports afresh."""
        saved = saved or {}
        self.first_step = saved.get("first_imbalance_step")
        self.imbalanced_steps = saved.get("imbalanced_steps", 0)
        self.repairs = list(saved.get("repairs", []))

    def check(self, audit: dict, step: int, repairs: Sequence[str] = ()) -> list[str]:
        """Record one ``ReplayBuffer.audit()`` at ``step``; returns the lines to print: each
        new repair of the buffer, and the imbalance when it appears, changes or clears."""
        lines = [f"WARNING: {r}" for r in repairs[self._repairs_seen :]]
        self.repairs.extend(repairs[self._repairs_seen :])
        self._repairs_seen = len(repairs)
        diff = audit["imbalance"]
        if diff:
            self.imbalanced_steps += 1
            if self.first_step is None:
                self.first_step = step
        if diff != self.imbalance:
            lines.append(self._report(audit, step) if diff else self._cleared(audit, step))
        self.imbalance, self.foreign = diff, audit["foreign"]
        return lines

    def _report(self, audit: dict, step: int) -> str:
        diff, n = audit["imbalance"], self.name
        what = (
            f"{diff} committed group(s) are not accounted for (deleted from the stream {n}, or a "
            f"counter of {n}:stats raised)"
            if diff > 0
            else f"{-diff} group(s) more are accounted for than were committed (a counter of "
            f"{n}:stats edited, or committed lowered)"
        )
        return (
            f"WARNING: buffer ledger does not balance at step {step}: {describe(audit)}; {what}. "
            "Something outside the job changed the buffer's state. Training goes on (every "
            "group is still checked before a step), but the buffer's totals are not to be "
            "trusted: summary.json's ledger block will say so. Find the other client "
            f"writing to the keys {n} and {n}:*, and give the next run a fresh buffer.name"
        )

    def _cleared(self, audit: dict, step: int) -> str:
        return f"buffer ledger balances again at step {step}: {describe(audit)}"

    def to_dict(self) -> dict:
        """The summary's (and a checkpoint's) ``ledger`` block, as of the last check."""
        return {
            "balanced": self.imbalance == 0,
            "imbalance": self.imbalance,
            "imbalanced_steps": self.imbalanced_steps,
            "first_imbalance_step": self.first_step,
            "foreign_unread": self.foreign,
            "repairs": list(self.repairs),
        }
