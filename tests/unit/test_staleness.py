"""Staleness filter and admission gate against hand-computed cases."""

from __future__ import annotations

import random

import pytest

from asyncrl.types import Group, Sample
from buffer.redis_buffer import Entry
from buffer.staleness import AdmissionGate, is_fresh, may_generate, split_by_staleness


def _group(gid: str, versions: list[int]) -> Group:
    n = len(versions)
    return Group(gid, 0, 0, [Sample([1], [2] * n, [-1.0] * n, versions, 0.0)])


@pytest.mark.parametrize(
    ("version_min", "learner_version", "max_staleness", "fresh"),
    [
        (5, 5, 0, True),  # on-policy
        (4, 5, 0, False),  # one step old is stale when strictly on-policy
        (3, 5, 2, True),  # exactly at the bound
        (2, 5, 2, False),  # one past the bound
        (7, 5, 0, True),  # newer than the learner (cannot happen, but is not stale)
        (0, 0, 0, True),
    ],
)
def test_is_fresh_boundary(version_min, learner_version, max_staleness, fresh) -> None:
    g = _group("g", [version_min, version_min + 1])
    assert g.version_min == version_min
    assert is_fresh(g, learner_version, max_staleness) is fresh
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
        may_generate(3, 3, -1)


@pytest.mark.parametrize(
    ("actor", "learner", "max_staleness", "ok"),
    [
        (5, 5, 0, True),
        (4, 5, 0, False),  # on-policy: must sync first
        (3, 5, 2, True),  # exactly at the bound
        (2, 5, 2, False),
        (0, -1, 0, True),  # learner has not published a version yet
        (6, 5, 0, True),
    ],
)
def test_may_generate(actor, learner, max_staleness, ok) -> None:
    assert may_generate(actor, learner, max_staleness) is ok
    assert AdmissionGate.may_generate(actor, learner, max_staleness) is ok


def test_admitted_generation_is_fresh_at_admission_time() -> None:
    """The gate's invariant: a group started when admitted is not stale at that version."""
    for learner in range(0, 10):
        for k in range(0, 4):
            for actor in range(0, 12):
                if may_generate(actor, learner, k):
                    assert is_fresh(_group("g", [actor]), learner, k)
