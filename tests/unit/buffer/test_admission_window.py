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


@pytest.mark.parametrize(
    ("learner_version", "wants", "weights_version", "last_version", "window"),
    [
        (5, 0, 5, 9, 32),  # 4 reads left after this one: the bound still limits
        (5, 0, 5, 7, 16),  # reads at 6 and 7 left: two batches, not four
        (5, 3, 5, 5, 3),  # the last read: only what it still wants
        (5, 0, 5, 5, 0),  # the last step trains: nothing more to start
        (5, 0, 3, 7, 16),  # lag 2 and 2 reads left: both limit alike
        (6, 0, 6, 5, 0),  # past the end (a resumed run with fewer steps): never negative
    ],
)
def test_the_window_reaches_no_further_than_the_runs_last_read(
    learner_version, wants, weights_version, last_version, window
):
    got = admission_window(learner_version, wants, weights_version, 4, 8, last_version)
    assert got == window


@pytest.mark.parametrize("bad", [(-1, 8, 0), (1, 0, 0), (1, 8, -1)])
def test_bad_arguments_are_refused(bad):
    max_staleness, batch_groups, wants = bad
    with pytest.raises(ValueError):
        admission_window(3, wants, 3, max_staleness, batch_groups)


def _simulate(
    rng: random.Random, s: int, b: int, steps: int, last: int | None = None
) -> tuple[list[int], list[int]]:
    """A learner that reads ``b`` groups per version in admission order (reads happen one at
    a time as groups arrive) and actors whose weights lag by 0..s versions, admitting while the
    system holds fewer groups than the window. Returns the staleness of every group read, and
    the groups left unread when the run ends (``last``: the run's last read version, told to
    the window)."""
    version, wants, weights = 0, b, 0
    system: list[int] = []  # weights versions of leased + unread groups, in admission order
    seen: list[int] = []
    while version < steps:
        event = rng.random()
        if event < 0.5:  # an actor tries to start a group
            if len(system) < admission_window(version, wants, weights, s, b, last):
                system.append(weights)
        elif event < 0.6:  # the actors' weights catch up a little
            weights = rng.randint(max(weights, version - s), version)
        elif wants > 0 and system:  # the learner reads the oldest group
            seen.append(version - system.pop(0))
            wants -= 1
        elif wants == 0:  # the learner trains the full batch: next version, a new read
            version, wants = version + 1, b
    return seen, system


@pytest.mark.parametrize(("s", "b"), [(0, 4), (1, 8), (2, 3), (4, 8)])
@pytest.mark.parametrize("seed", range(5))
def test_groups_read_in_admission_order_are_never_stale(s, b, seed):
    seen, _ = _simulate(random.Random(seed), s, b, steps=60)
    assert len(seen) >= 60 * b  # it made progress: no deadlock
    assert max(seen) <= s
    # and it is not over-cautious: groups do reach the bound
    assert max(seen) == s


@pytest.mark.parametrize(("s", "b"), [(0, 4), (1, 8), (4, 8)])
@pytest.mark.parametrize("seed", range(5))
def test_told_the_last_read_the_window_leaves_nothing_unread_at_the_end(s, b, seed):
    steps = 9
    seen, left = _simulate(random.Random(seed), s, b, steps, last=steps - 1)
    assert len(seen) == steps * b and left == []  # every started group was read
    assert max(seen) <= s


def test_untold_the_window_leaves_groups_unread_at_the_end():
    """The contrast: the same runs without ``last_version`` end with groups started for steps
    that never come (up to the bound's worth of batches)."""
    left = [len(_simulate(random.Random(seed), 4, 8, 9)[1]) for seed in range(5)]
    assert max(left) <= 4 * 8 and sum(left) > 0
