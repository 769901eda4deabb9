"""The ranks other than 0 run the learner loop on a ``NullHub`` (learner/hub/null.py), rank 0 on a
``Hub`` (learner/hub/hub.py): both must be what the loop holds, a ``LearnerHub``
(learner/hub/protocol.py), and the loop, the learner's main and the checkpoint code must call
nothing else on it. mypy checks both statically (tests/unit/conformance.py and the annotated
callers; ``make lint`` checks the same with every type followed). A ``NullHub`` answers
neutrally (rank 0's answers are the ones broadcast)."""

from __future__ import annotations

from asyncrl.learner.hub.null import NullHub
from tests.unit.typecheck import CONFORMANCE, mypy, rejected

SEAM = [
    "asyncrl/learner/state/checkpoint_hub.py",
    "asyncrl/learner/hub/protocol.py",
    "asyncrl/learner/hub/hub.py",
    "asyncrl/learner/hub/null.py",
]
CALLERS = [
    "asyncrl/learner/trainer.py",
    "asyncrl/learner/main.py",
    "asyncrl/learner/state/run_state.py",
]

DRIFTED = """
from collections.abc import Iterable

from asyncrl.learner.hub.null import NullHub
from asyncrl.learner.hub.protocol import LearnerHub


class Quiet:  # a hub that only says
    def say(self, text: str) -> None: ...


class NoRetry(NullHub):  # send_weights without its attempt
    def send_weights(self, named: Iterable, version: int) -> bool:  # type: ignore[override]  # the drift
        return False


def loop(hub: LearnerHub) -> None:
    hub.pause_actors()  # not a call of the protocol


quiet: LearnerHub = Quiet()
no_retry: LearnerHub = NoRetry()
"""


def test_hub_and_null_hub_are_learner_hubs_and_the_loop_calls_nothing_else(tmp_path):
    status, report = mypy([*SEAM, *CALLERS, CONFORMANCE], tmp_path / "cache")
    assert status == 0, report


def test_the_check_sees_a_missing_method_a_drifted_signature_and_an_unknown_call(tmp_path):
    drifted = tmp_path / "drifted.py"
    drifted.write_text(DRIFTED)
    errors, report = rejected([*SEAM, drifted], tmp_path / "cache")
    assert any('"LearnerHub" has no attribute "pause_actors"' in e for e in errors), report
    assert any('"Quiet", variable has type "LearnerHub"' in e for e in errors), report
    assert any('"NoRetry", variable has type "LearnerHub"' in e for e in errors), report
    assert len(errors) == 3, report


def test_null_answers_are_neutral():
    null = NullHub()
    assert null.stop_requested() is False
    assert null.next_groups(0) is None  # this rank receives the batch
    assert null.sync_allowed(3, 1) is False and null.end_validation_due(3) is False
    assert null.trained_ids() == [] and null.tallies() == {}
