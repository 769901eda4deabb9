"""The admission window (buffer/staleness.py ``admission_window``, ``buffer.admission=window``):
closed-form cases, and the bound it proves, checked by simulating a learner that reads in
admission order while actors with lagging weights admit whatever the window allows."""

from __future__ import annotations

import random

import pytest

from asyncrl.buffer.staleness import admission_window


@pytest.mark.parametrize(
    ("learner_version", "wants", "weights_version", "max_staleness", "batch_groups", "window"),
    [
        (5, 0, 5, 4, 8, 32),  # training, weights current: s batches ahead (= capacity's auto)
        (5, 0, 4, 4, 8, 24),  # one version behind: one batch less
        (5, 8, 4, 4, 8, 32),  # reading a whole batch at 5: those 8 are read at 5 too
        (5, 3, 5, 1, 8, 11),  # 3 still wanted now + one batch for version 6
        (5, 0, 4, 1, 8, 0),  # behind by the bound while training: wait for weights
        (5, 2, 4, 1, 8, 2),  # ... but the groups the read waits for may start
        (5, 0, 1, 2, 8, 0),  # further behind than the bound: never negative
        (-1, 0, 0, 2, 4, 8),  # before the first publish: lag 0
        (3, 4, 3, 0, 4, 4),  # bound 0: exactly what the read still wants
    ],
)
def test_closed_form(learner_version, wants, weights_version, max_staleness, batch_groups, window):
    got = admission_window(learner_version, wants, weights_version, max_staleness, batch_groups)
    assert got == window


@pytest.mark.parametrize("bad", [(-1, 8, 0), (1, 0, 0), (1, 8, -1)])
def test_bad_arguments_are_refused(bad):
    max_staleness, batch_groups, wants = bad
    with pytest.raises(ValueError):
        admission_window(3, wants, 3, max_staleness, batch_groups)


def _simulate(rng: random.Random, s: int, b: int, steps: int) -> list[int]:
    """A learner that reads ``b`` groups per version in admission order (reads happen one at
    a time as groups arrive) and actors whose weights lag by 0..s versions, admitting while the
    system holds fewer groups than the window. Returns the staleness of every group read."""
    version, wants, weights = 0, b, 0
    system: list[int] = []  # weights versions of leased + unread groups, in admission order
    seen: list[int] = []
    while version < steps:
        event = rng.random()
        if event < 0.5:  # an actor tries to start a group
            if len(system) < admission_window(version, wants, weights, s, b):
                system.append(weights)
        elif event < 0.6:  # the actors' weights catch up a little
            weights = rng.randint(max(weights, version - s), version)
        elif wants > 0 and system:  # the learner reads the oldest group
            seen.append(version - system.pop(0))
            wants -= 1
        elif wants == 0:  # the learner trains the full batch: next version, a new read
            version, wants = version + 1, b
    return seen


@pytest.mark.parametrize(("s", "b"), [(0, 4), (1, 8), (2, 3), (4, 8)])
@pytest.mark.parametrize("seed", range(5))
def test_groups_read_in_admission_order_are_never_stale(s, b, seed):
    seen = _simulate(random.Random(seed), s, b, steps=60)
    assert len(seen) >= 60 * b  # it made progress: no deadlock
    assert max(seen) <= s
    # and it is not over-cautious: groups do reach the bound
    assert max(seen) == s
