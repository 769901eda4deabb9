"""The staleness rule (buffer/staleness.py) against hand-computed cases: the learner's filter
(``split_by_staleness``) and the actors' admission (``within_staleness`` on the weights they
hold) are one rule, so a group admitted at a learner version is fresh at that version."""

from __future__ import annotations

import random

import pytest

from asyncrl.buffer.staleness import split_by_staleness, staleness, within_staleness
from asyncrl.buffer.stream_reads import Entry
from asyncrl.core.types import Group, Sample


def _group(gid: str, versions: list[int]) -> Group:
    n = len(versions)
    return Group(gid, 0, 0, [Sample([1], [2] * n, [-1.0] * n, versions, 0.0)])


@pytest.mark.parametrize(
    ("oldest", "learner_version", "max_staleness", "fresh"),
    [
        (5, 5, 0, True),  # on-policy
        (4, 5, 0, False),  # one step old is stale when strictly on-policy
        (3, 5, 2, True),  # exactly at the bound
        (2, 5, 2, False),  # one past the bound
        (7, 5, 0, True),  # newer than the learner (cannot happen, but is not stale)
        (0, 0, 0, True),
        (0, -1, 0, True),  # the learner has not published a version yet: admits
    ],
)
def test_rule_boundary_for_groups_and_admission(oldest, learner_version, max_staleness, fresh):
    assert staleness(learner_version, oldest) == learner_version - oldest
    assert within_staleness(learner_version, oldest, max_staleness) is fresh
    g = _group("g", [oldest, oldest + 1])
    assert g.version_min == oldest
    f, s = split_by_staleness([g], learner_version, max_staleness)
    assert (f, s) == (([g], []) if fresh else ([], [g]))


def test_split_uses_oldest_token_and_keeps_order() -> None:
    # Mixed-version completions: the oldest token decides (version_min), not the newest.
    groups = [_group("a", [3, 9]), _group("b", [7]), _group("c", [5, 6]), _group("d", [6, 6])]
    fresh, stale = split_by_staleness(groups, learner_version=9, max_staleness=3)
    assert [g.group_id for g in fresh] == ["b", "d"]
    assert [g.group_id for g in stale] == ["a", "c"]


def test_split_accepts_entries() -> None:
    entries = [Entry(f"1-{i}", _group(str(i), [i]), 1) for i in range(6)]
    fresh, stale = split_by_staleness(entries, learner_version=5, max_staleness=2)
    assert [e.entry_id for e in fresh] == ["1-3", "1-4", "1-5"]
    assert [e.entry_id for e in stale] == ["1-0", "1-1", "1-2"]


@pytest.mark.parametrize("seed", range(20))
def test_split_partition_invariants(seed: int) -> None:
    rng = random.Random(seed)
    groups = [_group(str(i), [rng.randint(0, 20)]) for i in range(rng.randint(0, 30))]
    v, k = rng.randint(0, 25), rng.randint(0, 5)
    fresh, stale = split_by_staleness(groups, v, k)
    assert len(fresh) + len(stale) == len(groups)
    assert all(v - g.version_min <= k for g in fresh)
    assert all(v - g.version_min > k for g in stale)
    # order kept: each part is a subsequence of the input
    assert [g for g in groups if g in fresh] == fresh
    assert [g for g in groups if g in stale] == stale


def test_negative_max_staleness_rejected() -> None:
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        split_by_staleness([], 3, -1)
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        within_staleness(3, 3, -1)


def test_a_group_admitted_is_fresh_at_that_learner_version() -> None:
    """Admission's invariant: an actor admitted with weights ``a`` samples tokens of version
    >= ``a``, so the learner's filter keeps the group at the version it was admitted at."""
    for learner in range(-1, 10):
        for k in range(0, 4):
            for actor in range(0, 12):
                if within_staleness(learner, actor, k):
                    g = _group("g", [actor, actor + 1])
                    assert split_by_staleness([g], learner, k) == ([g], [])
