"""``asyncrl.buffer.cursors`` on a real redis-server: the prompt cursor claims every index of an
actor's stride exactly once across restarts (leftovers first), stops at ``end``, and the
sync quota admits exactly ``per_version`` groups per version across actors."""

from __future__ import annotations

import threading

import pytest

from asyncrl.buffer.cursors import PromptCursor, SyncQuota, cursor_key, inflight_key
from asyncrl.buffer.redis_buffer import ReplayBuffer

pytestmark = pytest.mark.redis


def test_stride_leftovers_first_and_the_end(redis_client, buffer_name):
    buf = ReplayBuffer(redis_client, buffer_name, capacity=4)
    first = PromptCursor(buf, actor_id=1, num_actors=3, end=14)
    assert [first.next() for _ in range(3)] == [1, 4, 7]
    first.done(4)  # committed; 1 and 7 were in flight when it was killed
    assert first.claimed() == 3 and first.in_flight() == [1, 7]
    assert int(redis_client.get(cursor_key(buffer_name, 1))) == 3
    assert redis_client.smembers(inflight_key(buffer_name, 1)) == {b"1", b"7"}

    again = PromptCursor(buf, actor_id=1, num_actors=3, end=14)  # the restart
    assert again.resume() == [1, 7]
    got = []
    while (index := again.next()) is not None:
        got.append(index)
        again.done(index)
    assert got == [1, 7, 10, 13]  # leftovers first, then fresh claims up to end (14)
    assert again.claim() is None and again.claimed() == 5  # the cursor stays at the end
    assert again.in_flight() == []
    assert PromptCursor(buf, 0, 3, None).next() == 0  # other actors: their own stride


def test_concurrent_claims_never_share_an_index(redis_client, buffer_name):
    buf = ReplayBuffer(redis_client, buffer_name, capacity=4)
    got: list[int] = []
    lock = threading.Lock()

    def claim(n: int) -> None:
        cursor = PromptCursor(buf, actor_id=0, num_actors=2, end=None)  # e.g. a zombie
        for _ in range(n):
            index = cursor.claim()
            with lock:
                got.append(index)

    threads = [threading.Thread(target=claim, args=(50,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(0, 400, 2))


def test_sync_quota_admits_per_version_across_actors(redis_client, buffer_name):
    buf = ReplayBuffer(redis_client, buffer_name, capacity=4)
    actors = [SyncQuota(buf, per_version=3) for _ in range(2)]
    taken = [q.take(0) for _ in range(3) for q in actors]
    assert taken.count(True) == 3 and taken[:3] == [True] * 3
    assert actors[1].take(1)  # a new version has a fresh quota
    with pytest.raises(ValueError, match="per_version"):
        SyncQuota(buf, per_version=0)


def test_batched_claims_leftovers_first_and_stop_at_the_end(redis_client, buffer_name):
    """``next_many``: an earlier run's leftovers, then fresh claims, all in one call; fewer
    only once the stride reaches ``end``, and the cursor stays there."""
    buf = ReplayBuffer(redis_client, buffer_name, capacity=4)
    first = PromptCursor(buf, actor_id=0, num_actors=2, end=13)
    assert first.next_many(3) == [0, 2, 4]
    first.done(2)
    again = PromptCursor(buf, actor_id=0, num_actors=2, end=13)  # the restart
    assert again.next_many(1) == [0] and again.next_many(3) == [4, 6, 8]
    assert again.next_many(5) == [10, 12] and again.next_many(2) == []
    assert again.claimed() == 7 and again.in_flight() == [0, 4, 6, 8, 10, 12]


def test_batched_quota_takes_never_admit_more_than_per_version(redis_client, buffer_name):
    buf = ReplayBuffer(redis_client, buffer_name, capacity=4)
    a, b = SyncQuota(buf, per_version=5), SyncQuota(buf, per_version=5)
    assert a.take_many(0, 3) == 3 and b.take_many(0, 4) == 2 and a.take_many(0, 1) == 0
    b.give_back(0, 1)  # one admission found no buffer slot
    assert a.take_many(0, 4) == 1 and not b.take(0)
    assert b.take_many(1, 9) == 5  # a new version: a fresh quota


def test_concurrent_batched_quota_takes_admit_exactly_per_version(redis_client, buffer_name):
    buf = ReplayBuffer(redis_client, buffer_name, capacity=4)
    got: list[int] = []

    def take() -> None:
        quota = SyncQuota(buf, per_version=37)
        got.extend(quota.take_many(0, 3) for _ in range(10))

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(got) == 37


def test_a_restart_forgets_quota_held_by_groups_never_committed(redis_client, buffer_name):
    """mode=sync, a learner restarting at version 6: the earlier run's actor took version 6's
    whole quota and stopped before committing (seen in a LoRA resume test: the step at 6 then
    waited until its data timeout). ``reset`` frees versions 6 on, not those before."""
    buf = ReplayBuffer(redis_client, buffer_name, capacity=4)
    quota = SyncQuota(buf, per_version=4)
    assert quota.take_many(5, 4) == 4 and quota.take_many(6, 4) == 4 and quota.take_many(7, 1) == 1
    assert quota.take_many(6, 4) == 0  # used up: the restarted step would wait forever
    assert quota.reset(6, 7) == 5
    assert quota.take_many(6, 4) == 4 and quota.take_many(7, 4) == 4
    assert quota.take_many(5, 1) == 0  # an older version keeps its count
