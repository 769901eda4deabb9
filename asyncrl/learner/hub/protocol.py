"""``LearnerHub``: everything the learner loop asks of its hub, and nothing more.

Rank 0 holds a ``asyncrl.learner.hub.hub.Hub`` (the buffer, the control plane, the weight
sender, the run log); the other ranks hold a ``asyncrl.learner.hub.null.NullHub`` that answers
neutrally. Both implement this protocol structurally; tests/unit/conformance.py assigns each to
a ``LearnerHub`` under mypy (``make lint``), so a method the loop calls cannot go missing on
either. Callers: ``learner/trainer.py`` (the loop), ``learner/main.py`` (the process) and,
through ``CheckpointHub``, ``learner/state/run_state.py``. Light on purpose: no torch import
at run time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from asyncrl.learner.state.checkpoint_hub import CheckpointHub

if TYPE_CHECKING:
    from torch import Tensor

    from asyncrl.core.types import Group
    from asyncrl.learner.state.run_state import LearnerState


class LearnerHub(CheckpointHub, Protocol):
    """The loop's calls, in order: ``set_dynamic_sampling`` and ``start`` once, then per step
    ``next_groups`` -> (train) -> ``step_done`` -> ``sync_allowed``/``send_weights`` ->
    ``weights_at_actors`` -> ``after_step``, the checkpoint's calls (``CheckpointHub``), and
    ``end_validation_due``/``validate_final``, ``finish`` or ``close_log`` at the end. Where
    the ranks must agree (stop, sync, validate) rank 0's answer is broadcast."""

    def stop_requested(self) -> bool:
        """True once a stop was requested (SIGTERM/SIGINT, a lost buffer claim)."""
        ...

    def claim_lost(self) -> str:
        """Why another learner took this one's buffer claim ("" while it is held): the run
        must then fail, not finish (buffer/learner_claim.py)."""
        ...

    def claim_superseded(self) -> bool:
        """Whether the learner that took the claim is a restarted one of this same run."""
        ...

    def start(self, version: int) -> None:
        """Publish the run's meta, re-read pending groups, wait for the actors, open the channel."""
        ...

    def set_dynamic_sampling(self, on: bool) -> None:
        """DAPO dynamic sampling: drop groups whose rewards are all equal where they are read."""
        ...

    def next_groups(self, version: int) -> list[Group] | None:
        """The step's groups; None to sync weights first (and on ranks other than 0)."""
        ...

    def step_done(self) -> None:
        """The step of the last batch ran: a crash from here on is not its data's fault."""
        ...

    def send_weights(
        self, named: Iterable[tuple[str, Tensor]], version: int, attempt: int = 0
    ) -> bool:
        """One try of a weight sync (collective gather); True when another try should follow."""
        ...

    def after_step(self, state: LearnerState, metrics: dict) -> None:
        """Check the buffer's ledger, mark the step's groups trained, log the step's record."""
        ...

    def weights_at_actors(self, version: int, start: bool = False) -> None:
        """The actors hold the weights of ``version`` now: validate them if due."""
        ...

    def sync_allowed(self, version: int, synced: int) -> bool:
        """May the weights of ``version`` go to the actors (which hold ``synced``) now?"""
        ...

    def end_validation_due(self, version: int) -> bool:
        """After the last step: finish a validation under way; validate ``version`` too?"""
        ...

    def validate_final(self, version: int) -> None:
        """Validate the final weights (at the actors now) and wait for the result."""
        ...

    def no_batch_reason(self) -> str:
        """Why the run ends without a batch to train ("" where unknown)."""
        ...

    def close_log(self, status: str) -> None:
        """End the run log and the trackers' runs with ``status`` (idempotent)."""
        ...

    def finish(self, state: LearnerState) -> dict:
        """Stop the actors, write and print the run's summary; returns it."""
        ...
