"""``CheckpointHub``: what saving and resuming a checkpoint (``run_state``) asks of the hub.

The loop's whole protocol, ``asyncrl.learner.hub.protocol.LearnerHub``, extends this one: the
hub's room sits above this one (tests/unit/test_layers.py), so the part of it that the state
code needs is declared here, beside its users. Light on purpose: no torch import.
"""

from __future__ import annotations

from typing import Protocol


class CheckpointHub(Protocol):
    """Rank 0's hub (``Hub``) or a ``NullHub`` on the other ranks, as the checkpoint code uses it."""

    def say(self, text: str) -> None:
        """Rank 0 says ``text`` in its log; the other ranks stay quiet."""
        ...

    def trained_ids(self) -> list[str]:
        """The groups trained since the last ack, called right before a checkpoint is saved."""
        ...

    def ack_trained(self) -> None:
        """Ack the groups of ``trained_ids``, called right after the checkpoint is durable."""
        ...

    def ack_ids(self, ids: list[str]) -> None:
        """Ack the groups ``ids`` a resumed checkpoint holds (again: acking is idempotent)."""
        ...

    def tallies(self) -> dict:
        """The run's totals so far, saved in each checkpoint."""
        ...

    def restore_tallies(self, saved: dict) -> None:
        """Start from a checkpoint's ``tallies()`` (absent in older checkpoints: from 0)."""
        ...
