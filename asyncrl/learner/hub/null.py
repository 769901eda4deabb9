"""``NullHub``: what the learner ranks other than 0 hold where rank 0 holds its ``Hub``.

The loop (learner/trainer.py) calls the same methods on every rank, so it reads straight,
without an ``if hub`` on every other line. Only rank 0 does I/O (buffer, actors, run log);
here every method does nothing and returns a neutral value. Where the ranks must agree on a
decision (stop, sync, validate), rank 0's answer is broadcast (``trainer._rank0_flag``) and
the value returned here is ignored. Light on purpose: no torch, Redis or zmq import.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

    from asyncrl.learner.state.run_state import LearnerState


class NullHub:
    """``asyncrl.learner.hub.protocol.LearnerHub``, doing nothing (ranks other than 0)."""

    def say(self, text: str) -> None:
        """Rank 0 says what happens; the other ranks stay quiet."""

    def stop_requested(self) -> bool:
        """Rank 0 hears stop requests and decides for every rank."""
        return False

    def claim_lost(self) -> str:
        """Rank 0 holds the buffer's claim."""
        return ""

    def claim_superseded(self) -> bool:
        return False

    def no_batch_reason(self) -> str:
        """Rank 0 says why no batch came (its text reaches every rank)."""
        return ""

    def set_dynamic_sampling(self, on: bool) -> None:
        pass

    def start(self, version: int) -> None:
        pass

    def next_groups(self, version: int) -> None:
        """None: this rank receives the batch from rank 0 (``asyncrl.learner.compute.batch.broadcast_batch``)."""
        return None

    def step_done(self) -> None:
        pass

    def send_weights(
        self, named: Iterable[tuple[str, Tensor]], version: int, attempt: int = 0
    ) -> bool:
        """Take part in the gather only (rank 0 sends); rank 0 says whether to try again."""
        for _ in named:
            pass
        return False

    def after_step(self, state: LearnerState, metrics: dict) -> None:
        pass

    def weights_at_actors(self, version: int, start: bool = False) -> None:
        pass

    def sync_allowed(self, version: int, synced: int) -> bool:
        return False  # ignored: rank 0 decides

    def end_validation_due(self, version: int) -> bool:
        return False  # ignored: rank 0 decides

    def validate_final(self, version: int) -> None:
        pass

    def trained_ids(self) -> list[str]:
        """No groups: only rank 0 knows (and acks) which groups were trained."""
        return []

    def ack_trained(self) -> None:
        pass

    def ack_ids(self, ids: list[str]) -> None:
        pass

    def tallies(self) -> dict:
        return {}

    def restore_tallies(self, saved: dict) -> None:
        pass

    def close_log(self, status: str) -> None:
        pass

    def finish(self, state: LearnerState) -> dict:
        return {}
