"""``wait_for_learner``: the actor meets the learner through the buffer's meta, and refuses a
learner that paces admission differently (``buffer.admission``): actors on ``window`` need the
``learner_wants`` that only a ``window`` learner publishes."""

from __future__ import annotations

import asyncio
import json

import pytest

from asyncrl.actors.actor import wait_for_learner
from asyncrl.core.runtime.fatal import FatalError
from asyncrl.core.runtime.waiting import Wait

KEYS = {"server_public": "s", "client_public": "c", "client_secret": "x"}


class _Buffer:
    def __init__(self, meta: dict) -> None:
        self._meta = meta

    def meta(self) -> dict:
        return dict(self._meta)


def _meet(meta: dict, admission: str):
    wait = Wait("a learner", 5.0, lambda text: None, lambda: False)
    return asyncio.run(wait_for_learner(_Buffer(meta), wait, admission))


def _learner(**extra) -> dict:
    return {"control_addr": "tcp://127.0.0.1:1", "control_keys": json.dumps(KEYS), **extra}


def test_the_same_admission_meets_the_learner():
    assert _meet(_learner(admission="window"), "window").address == "tcp://127.0.0.1:1"
    assert _meet(_learner(admission="capacity"), "capacity").client_secret == "x"


def test_a_learner_from_before_the_window_runs_capacity():
    assert _meet(_learner(), "capacity").address == "tcp://127.0.0.1:1"
    with pytest.raises(FatalError, match="buffer.admission=capacity and this actor"):
        _meet(_learner(), "window")


def test_another_admission_is_refused_naming_both():
    with pytest.raises(FatalError, match="give every role of the job the same buffer.admission"):
        _meet(_learner(admission="window"), "capacity")
