"""The learner's ``GroupSource`` over a real redis-server: DAPO dynamic sampling drops groups
whose rewards are all equal (acked as ``dropped_uniform``, counted once) and reads on until
the batch is full; with it off those groups are trained like any other."""

from __future__ import annotations

import dataclasses
import random

import pytest

from asyncrl.buffer.redis_buffer import ReplayBuffer
from asyncrl.buffer.testing import add_as_committed, random_group
from asyncrl.learner.hub.data import GroupSource

pytestmark = pytest.mark.redis


def _commit(buf: ReplayBuffer, gid: str, rewards: list[float]) -> None:
    g = random_group(random.Random(gid), gid, n=len(rewards), vocab_size=100, versions=(5, 5))
    g = dataclasses.replace(
        g,
        samples=[dataclasses.replace(s, reward=r) for s, r in zip(g.samples, rewards, strict=True)],
    )
    assert buf.commit(buf.lease(0, 1.0), g) is True


# committed in this order: uniform groups are interleaved with informative ones
GROUPS = [("u0", [1.0] * 4), ("m0", [1.0, 0.0, 0.0, 1.0]), ("u1", [0.0] * 4),
          ("m1", [0.25, 0.5, 0.5, 0.5]), ("u2", [0.3, 0.3 + 1e-9, 0.3, 0.3]),
          ("m2", [0.0, 0.0, 0.0, 1.0]), ("m3", [1.0, 0.9, 1.0, 1.0])]  # fmt: skip


@pytest.mark.parametrize("drop_uniform", [True, False])
def test_dynamic_sampling_drops_all_equal_groups_and_fills_the_batch(
    redis_client, buffer_name, drop_uniform
):
    buf = ReplayBuffer(redis_client, buffer_name, capacity=len(GROUPS))
    for gid, rewards in GROUPS:
        _commit(buf, gid, rewards)
    read: list[str] = []
    told: list[int] = []
    source = GroupSource(
        buf, "learner", 100, max_staleness=1, timeout_s=10.0, drop_uniform=drop_uniform,
        on_read=lambda gs: read.extend(g.group_id for g in gs), wants=told.append,
    )  # fmt: skip
    batch = source.next_batch(version=5, count=3)
    # what the read still wants, each time it changes, then 0 (the admission window's input)
    assert told == ([3, 2, 1, 0] if drop_uniform else [3, 0])
    got = [e.group.group_id for e in batch]
    # every group read is reported before admission (RunTotals.count_read), dropped ones too
    assert read == [g for g, _ in GROUPS][: len(read)] and set(got) <= set(read)
    assert not drop_uniform or {"u0", "u1", "u2"} <= set(read)
    s = buf.stats()
    if drop_uniform:
        # it had to read past u0, u1, u2 (and float noise counts as equal) to find 3 groups
        assert got == ["m0", "m1", "m2"]
        assert source.dropped_uniform == 3 and s["dropped_uniform"] == 3
    else:
        assert got == ["u0", "m0", "u1"]
        assert source.dropped_uniform == 0 and s["dropped_uniform"] == 0
    buf.ack([e.entry_id for e in batch], "trained")
    s = buf.stats()
    still = s["unread"] + s["pending"]
    assert s["committed"] == s["trained"] + s["dropped_uniform"] + still == len(GROUPS)


def test_a_wait_for_data_reports_times_out_with_the_fix_and_stops_on_request(
    redis_client, buffer_name
):
    """An empty buffer: the wait prints progress with what it has, fails at
    ``learner.data_timeout_s`` naming the fix, and a stop request ends it within a poll."""
    import threading
    import time

    from asyncrl.core.runtime.waiting import StopRequested
    from asyncrl.learner.hub.data import DataTimeout

    buf = ReplayBuffer(redis_client, buffer_name, capacity=4)
    _commit(buf, "m0", [1.0, 0.0, 0.0, 1.0])
    lines: list[str] = []
    source = GroupSource(buf, "learner", 100, max_staleness=1, timeout_s=2.5, say=lines.append)
    with pytest.raises(DataTimeout) as e:
        source.next_batch(version=5, count=2)
    assert "gave up waiting for fresh groups for the step at version 5 (have 1/2;" in str(e.value)
    assert "same buffer.url and buffer.name" in str(e.value)
    assert lines == []  # 2.5 s is shorter than the report interval: silent

    stop = threading.Event()
    source = GroupSource(buf, "learner", 100, max_staleness=1, timeout_s=60.0, stop=stop.is_set)
    threading.Timer(1.0, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(StopRequested):
        source.next_batch(version=5, count=2)
    assert 0.9 < time.monotonic() - t0 < 3.0  # one poll (a 1 s blocking read) after the stop


def _commit_at(buf: ReplayBuffer, gid: str, version: int) -> None:
    g = random_group(random.Random(gid), gid, n=4, vocab_size=100, versions=(version, version))
    assert buf.commit(buf.lease(0, 1.0), g) is True


def test_a_group_newer_than_any_version_of_this_run_is_refused_naming_it(redis_client, buffer_name):
    """Tokens of a negative staleness are impossible from this run's actors; a group
    from versions this run's learner reached before a restart (``ceiling``) is not foreign."""
    from asyncrl.core.runtime.fatal import FatalError

    buf = ReplayBuffer(redis_client, buffer_name, capacity=4)
    _commit_at(buf, "mine", 5)
    _commit_at(buf, "rolled-back", 7)
    source = GroupSource(buf, "learner", 100, max_staleness=2, timeout_s=5.0, ceiling=7)
    got = source.next_batch(version=5, count=2)  # restarted at 5 after the run reached 7
    assert [e.group.group_id for e in got] == ["mine", "rolled-back"]
    buf.ack([e.entry_id for e in got], "trained")
    _commit_at(buf, "foreign", 9)
    with pytest.raises(FatalError) as e:
        GroupSource(buf, "learner", 100, max_staleness=2, timeout_s=5.0).next_batch(5, 1)
    msg = str(e.value)
    assert "group 'foreign'" in msg and "policy version 9" in msg and "version 5" in msg
    assert "give each job its own buffer.name" in msg


def test_a_read_that_only_dead_letters_is_followed_by_the_wants_again(redis_client, buffer_name):
    """The buffer lowers ``learner_wants`` by every entry a read delivers, a malformed one
    too; after a read that found nothing valid the next read must publish what the batch
    still needs, or an admission window of 0 would leave the learner waiting for a group no
    actor may start (here: the group is committed only once the wants come again)."""
    buf = ReplayBuffer(redis_client, buffer_name, capacity=4)
    add_as_committed(redis_client, buffer_name, {b"group_id": b"bad", b"payload": b"not arrow"})
    told: list[int] = []

    def wants(n: int) -> None:
        told.append(n)
        buf.set_learner_wants(n)
        if len(told) == 2:
            _commit(buf, "m1", [0.0, 1.0, 1.0, 1.0])

    source = GroupSource(buf, "learner", 100, max_staleness=1, timeout_s=5.0, wants=wants)
    batch = source.next_batch(version=5, count=1)
    assert [e.group.group_id for e in batch] == ["m1"]
    assert buf.stats()["dropped_invalid"] == 1
    assert told == [1, 1, 0]
