"""The ranks other than 0 run the learner loop on a ``NullHub`` (learner/hub/null.py): it must
offer every ``hub.<method>`` the loop calls, with the signature ``asyncrl.learner.hub.hub.Hub`` has, and
answer neutrally (rank 0's answers are the ones broadcast)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import asyncrl.learner.trainer
from asyncrl.learner.hub.hub import Hub
from asyncrl.learner.hub.null import NullHub


def _public(cls) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(fn)
        for name, fn in vars(cls).items()
        if callable(fn) and not name.startswith("_")
    }


def test_every_hub_call_of_the_loop_exists_on_both_with_the_same_signature():
    source = Path(asyncrl.learner.trainer.__file__).read_text()
    called = set(re.findall(r"(?<![.\w])hub\.(\w+)", source))
    hub, null = _public(Hub), _public(NullHub)
    assert called, "the loop calls no hub method?"
    assert called <= set(null), f"NullHub lacks {sorted(called - set(null))}"
    assert set(null) <= set(hub), f"Hub lacks {sorted(set(null) - set(hub))}"
    for name, sig in null.items():
        assert list(sig.parameters) == list(hub[name].parameters), name


def test_null_answers_are_neutral():
    null = NullHub()
    assert null.stop_requested() is False
    assert null.next_groups(0) is None  # this rank receives the batch
    assert null.sync_allowed(3, 1) is False and null.end_validation_due(3) is False
    assert null.trained_ids() == [] and null.tallies() == {}
