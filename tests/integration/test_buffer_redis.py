"""ReplayBuffer and RedisServer against a real redis-server (no mocks of Redis)."""

from __future__ import annotations

import os
import random
import signal
import socket
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from asyncrl.buffer.codec import encode_group
from asyncrl.buffer.connection import BufferUnavailable, connect
from asyncrl.buffer.redis_buffer import BufferOptions, LeaseExpired, ReplayBuffer
from asyncrl.buffer.service.server import RedisOptions, RedisServer, RedisServerError
from asyncrl.buffer.staleness import Window, admission_window
from asyncrl.buffer.testing import random_group

pytestmark = pytest.mark.redis

_COUNTED = ("trained", "dropped_stale", "dropped_invalid", "dropped_poison", "dropped_uniform",
            "unread", "pending")  # fmt: skip


def _group(gid: str, seed: int = 0, versions=(0, 3)):
    return random_group(random.Random(seed), gid, vocab_size=100, versions=versions)


def _conserved(s: dict) -> bool:
    return (
        s["committed"] == sum(s[k] for k in _COUNTED) and s["leased"] + s["unread"] <= s["capacity"]
    )


def _fill(buf: ReplayBuffer, gids: list[str]) -> None:
    for gid in gids:
        lease = buf.lease(0, timeout_s=1.0)
        assert lease is not None
        assert buf.commit(lease, _group(gid, seed=hash(gid) % 1000)) is True


# -- buffer semantics ------------------------------------------------------------------------


def test_commit_read_ack_round_trip(redis_client, buffer_name):
    buf = ReplayBuffer(redis_client, buffer_name, capacity=4)
    groups = [_group(f"0:{i}", seed=i) for i in range(3)]
    for g in groups:
        assert buf.commit(buf.lease(0, 1.0), g) is True
    assert buf.stats() == {
        "committed": 3, "trained": 0, "dropped_stale": 0, "dropped_invalid": 0,
        "dropped_poison": 0, "dropped_uniform": 0, "unread": 3, "pending": 0, "leased": 0, "capacity": 4,
    }  # fmt: skip
    entries = buf.read("c0", count=10, block_ms=100, vocab_size=100)
    assert [e.group for e in entries] == groups  # FIFO, all fields equal
    assert all(e.deliveries == 1 for e in entries)
    assert buf.stats()["pending"] == 3 and buf.stats()["unread"] == 0
    assert buf.ack([entries[0].entry_id], "trained") == 1
    assert buf.ack([e.entry_id for e in entries[1:]], "dropped_stale") == 2
    s = buf.stats()
    assert (s["trained"], s["dropped_stale"], s["pending"], s["unread"]) == (1, 2, 0, 0)
    assert redis_client.xlen(buffer_name) == 0  # acked entries are deleted, not kept around
    assert buf.read("c0", count=10, block_ms=0) == []


def test_commit_is_idempotent_by_group_id(redis_client, buffer_name):
    buf = ReplayBuffer(redis_client, buffer_name, capacity=2)
    first, second = buf.lease(0, 1.0), buf.lease(1, 1.0)
    assert buf.commit(first, _group("7:1")) is True
    assert buf.commit(second, _group("7:1", seed=99)) is False  # same id, different content
    s = buf.stats()
    assert (s["committed"], s["unread"], s["leased"]) == (1, 1, 0)  # second lease released
    # still a duplicate after the first copy has been trained and deleted
    buf.ack([e.entry_id for e in buf.read("c", 5, 0)], "trained")
    assert buf.commit(buf.lease(0, 1.0), _group("7:1")) is False
    assert buf.stats()["committed"] == 1


def test_lease_many_grants_the_free_slots_in_one_call(redis_client, buffer_name):
    buf = ReplayBuffer(redis_client, buffer_name, capacity=5)
    _fill(buf, ["0:1"])
    before = redis_client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    got = buf.lease_many(0, 6, timeout_s=1.0)
    assert redis_client.info("commandstats")["cmdstat_evalsha"]["calls"] - before == 1
    assert len(got) == 4 and len(set(got)) == 4  # 5 slots - 1 unread
    assert buf.stats()["leased"] == 4 and buf.lease_many(1, 2, timeout_s=0.05) == []
    assert buf.release(got[0]) and buf.lease_many(1, 3, timeout_s=1.0)[0].startswith("1:")
    with pytest.raises(ValueError, match="count"):
        buf.lease_many(0, 0, timeout_s=1.0)


@pytest.mark.parametrize(
    ("learner_version", "wants", "weights_version", "max_staleness", "last_version"),
    [(5, 0, 5, 2, None), (5, 0, 4, 2, None), (5, 3, 4, 1, None), (5, 0, 3, 1, None),
     (-1, 0, 0, 1, None), (2, 4, 2, 0, None), (7, 1, 7, 3, None), (5, 0, 5, 3, 6),
     (5, 3, 5, 3, 5), (5, 0, 5, 2, 9), (6, 1, 6, 2, 5)],
)  # fmt: skip
def test_the_lease_script_keeps_the_admission_window_of_the_spec(
    redis_client, buffer_name, learner_version, wants, weights_version, max_staleness, last_version
):
    """LEASE with a ``Window`` grants min(capacity, ``admission_window``) - leased - unread,
    reading the learner's version, wants and last version from the meta in the same script."""
    batch_groups, used, capacity = 3, 2, 12
    buf = ReplayBuffer(redis_client, buffer_name, capacity=capacity)
    _fill(buf, ["0:1"])  # one unread ...
    assert buf.lease(0, 1.0) is not None  # ... and one leased
    if learner_version >= 0:
        buf.set_learner_version(learner_version)
    buf.set_learner_wants(wants)
    if last_version is not None:
        buf.set_learner_last_version(last_version)
    w = Window(weights_version, max_staleness, batch_groups)
    window = admission_window(
        learner_version, wants, weights_version, max_staleness, batch_groups, last_version
    )
    got = buf.lease_many(1, 20, timeout_s=0.05, window=lambda: w)
    assert len(got) == max(0, min(capacity, window) - used)
    assert len(buf.lease_many(1, 20, timeout_s=0.05)) == capacity - used - len(got)  # no window


def test_a_rise_of_the_learner_wants_wakes_a_lease_waiting_for_the_window(
    redis_client, buffer_name, monkeypatch
):
    import asyncrl.buffer.redis_buffer as rb

    monkeypatch.setattr(rb, "WAKE_POLL_S", 60.0)  # only a wake-up can end the wait in time
    monkeypatch.setattr(rb, "WINDOW_POLL_S", 60.0)
    buf = ReplayBuffer(redis_client, buffer_name, capacity=8)
    buf.set_learner_version(4)
    buf.set_learner_wants(0)
    w = Window(weights_version=3, max_staleness=1, batch_groups=4)  # window 0 while training
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(buf.lease_many(0, 4, 30.0, lambda: w)))
    waiter.start()
    time.sleep(0.5)
    assert not got  # blocked: the learner trains and the weights are a version behind
    buf.set_learner_wants(2)  # the learner reads at 4: 2 groups may start, read at 4
    waiter.join(timeout=10.0)
    assert got and len(got[0]) == 2


def test_a_read_moves_groups_from_free_to_read_at_once_in_the_window(redis_client, buffer_name):
    """A group the learner's read delivers leaves ``unread`` and counts against
    ``learner_wants`` in the same instant (both come from the stream's state, which XREADGROUP
    changes atomically), so a read never widens the window; a group then dropped (acked)
    comes back into what the learner wants."""
    buf = ReplayBuffer(redis_client, buffer_name, capacity=8)
    buf.set_learner_version(4)
    _fill(buf, ["0:1", "0:2"])
    buf.set_learner_wants(3)
    w = Window(weights_version=4, max_staleness=1, batch_groups=2)  # window = wants + 2

    def grant() -> int:
        got = buf.lease_many(1, 8, timeout_s=0.05, window=lambda: w)
        for lease in got:
            assert buf.release(lease)
        return len(got)

    assert grant() == 3  # 5 - 2 unread
    entries = buf.read("c", count=2, block_ms=0)
    assert len(entries) == 2
    assert grant() == 3  # 3 wanted - 2 read + 2, nothing unread: the same
    buf.ack([entries[0].entry_id], "dropped_stale")
    assert grant() == 4  # the learner wants one more
    buf.set_learner_wants(0)  # its batch is full: it trains
    assert grant() == 2


def test_a_lease_waiting_for_the_window_sees_the_actors_new_weights(redis_client, buffer_name):
    """Nothing in Redis changes when an actor's own weights arrive: the wait tries again
    within ``WINDOW_POLL_S`` with the version ``window()`` gives then."""
    buf = ReplayBuffer(redis_client, buffer_name, capacity=8)
    buf.set_learner_version(4)
    held = [3]  # a version behind: window 0 while the learner trains
    got: list = []

    def lease() -> None:
        got.append(buf.lease_many(0, 8, 30.0, lambda: Window(held[0], 1, 4)))

    waiter = threading.Thread(target=lease)
    waiter.start()
    time.sleep(0.5)
    assert not got
    t0 = time.monotonic()
    held[0] = 4  # the new weights: one batch may start
    waiter.join(timeout=10.0)
    assert got and len(got[0]) == 4 and time.monotonic() - t0 < 2.0


def test_a_commit_marks_its_prompt_done_in_the_same_script(redis_client, buffer_name):
    """``commit(..., in_flight=(key, index))``: a stored or duplicate group takes ``index``
    out of the set; a commit that stores nothing (lease gone, buffer full) leaves it."""
    buf = ReplayBuffer(
        redis_client, buffer_name, capacity=1, options=BufferOptions(lease_ttl_s=0.2)
    )
    key = f"{buffer_name}:inflight:0"
    redis_client.sadd(key, 3, 4, 5)
    assert buf.commit(buf.lease(0, 1.0), _group("0:3"), (key, 3)) is True
    assert redis_client.smembers(key) == {b"4", b"5"}
    buf.ack([e.entry_id for e in buf.read("c", 5, 0)], "trained")
    assert buf.commit(buf.lease(0, 1.0), _group("0:3"), (key, 4)) is False  # a duplicate
    assert redis_client.smembers(key) == {b"5"}
    late = buf.lease(0, 1.0)
    time.sleep(0.3)  # the lease expires ...
    _fill(buf, ["0:9"])  # ... and its slot is taken
    with pytest.raises(LeaseExpired):
        buf.commit(late, _group("0:5"), (key, 5))
    assert redis_client.smembers(key) == {b"5"}


def test_backpressure_blocks_until_learner_reads(redis_client, buffer_name):
    buf = ReplayBuffer(redis_client, buffer_name, capacity=2)
    _fill(buf, ["0:1", "0:2"])
    t0 = time.monotonic()
    assert buf.lease(0, timeout_s=0.2) is None  # full: blocks, then times out
    assert 0.2 <= time.monotonic() - t0 < 2.0
    assert buf.stats()["unread"] == 2  # nothing dropped or trimmed

    got: list = []
    waiter = threading.Thread(target=lambda: got.append(buf.lease(1, timeout_s=5.0)))
    waiter.start()
    time.sleep(0.1)
    assert not got  # still blocked
    assert len(buf.read("c", count=1, block_ms=0)) == 1  # delivered, not acked: frees a slot
    waiter.join(timeout=5.0)
    assert got and got[0] is not None
    assert buf.lease(2, timeout_s=0.05) is None  # 1 leased + 1 unread == capacity


def test_a_waiting_lease_blocks_in_redis_and_wakes_on_a_read_or_a_release(
    redis_client, buffer_name, monkeypatch
):
    """No busy polling: a lease on a full buffer makes one LEASE call, then blocks on
    ``<name>:wake`` until the learner's read (or another actor's release) frees a slot. The
    fallback poll is set to 60 s here, so only the wake-up can end the waits below."""
    import asyncrl.buffer.redis_buffer as rb

    monkeypatch.setattr(rb, "WAKE_POLL_S", 60.0)
    buf = ReplayBuffer(redis_client, buffer_name, capacity=2)
    _fill(buf, ["0:1", "0:2"])

    def lease_calls() -> int:
        stats = redis_client.info("commandstats")
        return sum(v["calls"] for k, v in stats.items() if k.startswith("cmdstat_evalsha"))

    def woken_by(free) -> str:
        got: list = []
        waiter = threading.Thread(target=lambda: got.append(buf.lease(1, timeout_s=30.0)))
        before = lease_calls()
        waiter.start()
        time.sleep(1.0)
        assert not got and lease_calls() - before <= 2  # one LEASE, then blocked in BLPOP
        free()
        waiter.join(timeout=10.0)
        assert got and got[0] is not None, "the waiter was not woken"
        return got[0]

    held = woken_by(lambda: buf.read("c", count=1, block_ms=0))  # full again: 1 unread, 1 held
    woken_by(lambda: buf.release(held))


def test_release_and_renew(redis_client, buffer_name):
    # a 2 s TTL with 1.2 s steps: each check has 0.8 s of slack for a stall on a busy machine
    buf = ReplayBuffer(
        redis_client, buffer_name, capacity=1, options=BufferOptions(lease_ttl_s=2.0)
    )
    lease = buf.lease(0, 1.0)
    assert buf.lease(1, 0.0) is None
    assert buf.release(lease) is True and buf.release(lease) is False
    lease = buf.lease(1, 0.0)
    time.sleep(1.2)
    assert buf.renew(lease) is True
    time.sleep(1.2)  # 2.4 s after the lease, but only 1.2 s after the renewal
    assert buf.stats()["leased"] == 1 and buf.lease(2, 0.0) is None
    time.sleep(1.2)
    assert buf.renew(lease) is False  # expired


def test_lease_expiry_reclaims_slots(redis_client, buffer_name):
    buf = ReplayBuffer(
        redis_client, buffer_name, capacity=2, options=BufferOptions(lease_ttl_s=1.0)
    )
    dead_a, dead_b = buf.lease(0, 1.0), buf.lease(1, 1.0)  # two actors that will "die"
    assert buf.lease(2, timeout_s=0.0) is None
    assert buf.leases_by_actor() == {0: 1, 1: 1}
    time.sleep(1.1)
    assert buf.stats()["leased"] == 0 and buf.leases_by_actor() == {}
    patient = ReplayBuffer(
        redis_client, buffer_name, capacity=2, options=BufferOptions(lease_ttl_s=30.0)
    )
    live = patient.lease(2, timeout_s=0.0)  # must not expire during the rest of the test
    assert live is not None and buf.leases_by_actor() == {2: 1}
    # A late commit on an expired lease is stored only while a slot is free...
    assert buf.commit(dead_a, _group("0:1")) is True
    s = buf.stats()
    assert (s["committed"], s["unread"], s["leased"]) == (1, 1, 1)
    # ...and refused, not over-filled, when the buffer is full.
    with pytest.raises(LeaseExpired, match="expired"):
        buf.commit(dead_b, _group("1:1"))
    assert buf.commit(live, _group("2:1")) is True
    assert _conserved(buf.stats()) and buf.stats()["unread"] == 2


def test_dead_letters_bad_payload_and_keeps_reading(redis_client, buffer_name):
    buf = ReplayBuffer(redis_client, buffer_name, capacity=8)
    _fill(buf, ["0:1"])
    bad_id = redis_client.xadd(buffer_name, {"payload": b"\x00not arrow"}).decode()
    _fill(buf, ["0:2"])
    too_big = random_group(random.Random(5), "0:3", vocab_size=1000)  # ids beyond vocab 100
    assert buf.commit(buf.lease(0, 1.0), too_big)
    _fill(buf, ["0:4"])

    entries = buf.read("c", count=10, block_ms=100, vocab_size=100)
    assert [e.group.group_id for e in entries] == ["0:1", "0:2", "0:4"]
    dead = dict(buf.dead_letters())
    assert set(dead) == {bad_id, next(i for i in dead if i != bad_id)}
    assert dead[bad_id].startswith("not an Arrow IPC stream")
    assert any("vocab_size 100" in reason for reason in dead.values())
    fields = redis_client.xrange(f"{buffer_name}:dead")[0][1]
    assert fields[b"payload"] == b"\x00not arrow"  # kept for a post-mortem
    s = buf.stats()
    assert (s["dropped_invalid"], s["pending"], s["unread"]) == (2, 3, 0)
    assert _conserved(s)  # the foreign entry is counted as committed once it is read


def test_only_invalid_entries_returns_empty(redis_client, buffer_name):
    buf = ReplayBuffer(redis_client, buffer_name, capacity=8)
    redis_client.xadd(buffer_name, {"group_id": b"x", "payload": b"junk"})
    redis_client.xadd(buffer_name, {"nothing": b"here"})
    redis_client.xadd(buffer_name, {"group_id": b"\xff\xfe", "seq": b"1", "payload": b"x"})
    assert buf.read("c", count=1, block_ms=50) == []
    assert buf.stats()["dropped_invalid"] == 3 and redis_client.xlen(buffer_name) == 0


def test_read_pending_after_restart(redis_client, buffer_name, redis_server):
    buf = ReplayBuffer(redis_client, buffer_name, capacity=8)
    _fill(buf, [f"0:{i}" for i in range(5)])
    entries = buf.read("learner-0", count=3, block_ms=100)
    buf.ack([entries[0].entry_id], "trained")

    # "restart": a new process with a new connection and a new ReplayBuffer object
    restarted = ReplayBuffer(connect(redis_server.url), buffer_name, capacity=8)
    pending = restarted.read_pending("learner-0")
    assert [e.entry_id for e in pending] == [e.entry_id for e in entries[1:]]
    assert [e.group for e in pending] == [e.group for e in entries[1:]]
    assert all(e.deliveries == 1 for e in pending)  # re-reading is not counted as a delivery
    assert restarted.read_pending("someone-else") == []
    assert [e.group.group_id for e in restarted.read("learner-0", 10, 0)] == ["0:3", "0:4"]
    assert _conserved(restarted.stats())


def test_ack_is_idempotent_and_checked(redis_client, buffer_name):
    buf = ReplayBuffer(redis_client, buffer_name, capacity=4)
    _fill(buf, ["0:1", "0:2"])
    ids = [e.entry_id for e in buf.read("c", 2, 0)]
    assert buf.ack(ids, "trained") == 2
    assert buf.ack(ids, "trained") == 0 and buf.ack(ids, "dropped_stale") == 0
    assert buf.stats()["trained"] == 2 and buf.stats()["dropped_stale"] == 0
    with pytest.raises(ValueError, match="state must be one of"):
        buf.ack(ids, "dropped_invalid")
    assert buf.ack([], "trained") == 0
    with pytest.raises(ValueError, match="not stream entry ids"):
        buf.ack([ids[0], "nope"], "trained")


def test_conservation_invariant_under_random_operations(redis_client, buffer_name):
    rng = random.Random(7)
    buf = ReplayBuffer(redis_client, buffer_name, capacity=5)
    leases, delivered = [], []
    for step in range(150):
        op = rng.choice(["lease", "commit", "dup", "release", "read", "ack", "junk"])
        if op == "lease" and (lease := buf.lease(0, 0.0)):
            leases.append(lease)
        elif op in ("commit", "dup") and leases:
            gid = f"0:{step if op == 'commit' else 0}"
            buf.commit(leases.pop(rng.randrange(len(leases))), _group(gid, seed=step))
        elif op == "release" and leases:
            buf.release(leases.pop())
        elif op == "read":
            delivered += buf.read("c", rng.randint(1, 3), 0, vocab_size=100)
        elif op == "ack" and delivered:
            k = rng.randint(1, len(delivered))
            buf.ack([e.entry_id for e in delivered[:k]], rng.choice(["trained", "dropped_stale"]))
            delivered = delivered[k:]
        elif op == "junk":
            # A foreign XADD bypasses commit(): it is reconciled (counted committed and
            # dropped_invalid) when read, so drain the stream before checking.
            redis_client.xadd(buffer_name, {"group_id": b"j", "payload": b"junk"})
            delivered += buf.read("c", 100, 0)
        s = buf.stats()
        assert _conserved(s), (step, op, s)
        assert s["leased"] == len(leases)
    assert buf.stats()["committed"] > 10


def test_concurrent_leases_never_exceed_capacity(redis_server, buffer_name):
    capacity, actors, per_actor = 3, 6, 6
    learner = ReplayBuffer(connect(redis_server.url), buffer_name, capacity)
    held, max_held, lock, done = [0], [0], threading.Lock(), threading.Event()
    snapshots: list[dict] = []

    def actor(i: int) -> None:
        buf = ReplayBuffer(connect(redis_server.url), buffer_name, capacity)
        k = 0
        while k < per_actor:  # odd actors lease two slots at a time where two are free
            leases = buf.lease_many(i, 1 + i % 2 if k + 1 < per_actor else 1, timeout_s=10.0)
            assert leases
            with lock:
                held[0] += len(leases)
                max_held[0] = max(max_held[0], held[0])
            time.sleep(0.002)
            for lease in leases:
                with lock:
                    held[0] -= 1  # before commit: afterwards the slot is an unread entry
                assert buf.commit(lease, _group(f"{i}:{k}", seed=k))
                k += 1

    def monitor() -> None:
        while not done.is_set():
            snapshots.append(learner.stats())

    def consume() -> None:
        trained = 0
        while trained < actors * per_actor:
            entries = learner.read("c", 1, 200)
            time.sleep(0.003)  # slower than the actors, so they hit backpressure
            trained += learner.ack([e.entry_id for e in entries], "trained")

    with ThreadPoolExecutor(actors + 2) as pool:
        watch, eat = pool.submit(monitor), pool.submit(consume)
        for f in [pool.submit(actor, i) for i in range(actors)]:
            f.result(timeout=30)
        eat.result(timeout=30)
        done.set()
        watch.result(timeout=5)
    assert max_held[0] <= capacity
    assert snapshots and all(_conserved(s) for s in snapshots)
    assert any(s["leased"] + s["unread"] == capacity for s in snapshots)  # it did fill up
    final = learner.stats()
    assert final["committed"] == final["trained"] == actors * per_actor


def test_versions_and_meta(redis_client, buffer_name):
    buf = ReplayBuffer(redis_client, buffer_name, capacity=3)
    assert buf.learner_version() == -1
    buf.set_learner_version(4)
    buf.set_meta(max_staleness=2, mode="async")
    assert buf.learner_version() == 4
    assert buf.meta()["max_staleness"] == "2" and buf.meta()["mode"] == "async"
    assert buf.meta()["capacity"] == "3" and buf.meta()["learner_version"] == "4"
    with pytest.raises(ValueError, match="managed by ReplayBuffer"):
        buf.set_meta(capacity=10)


def test_one_consumer_group_per_buffer(redis_client, buffer_name):
    ReplayBuffer(redis_client, buffer_name, 2, BufferOptions(consumer_group="job-a")).read(
        "c", 1, 0
    )
    other = ReplayBuffer(redis_client, buffer_name, 2, BufferOptions(consumer_group="job-b"))
    with pytest.raises(ValueError, match="consumed by group 'job-a'"):
        other.read("c", 1, 0)


# -- server and connection ------------------------------------------------------------------


def test_password_required(redis_server):
    anonymous = redis.Redis(
        host="127.0.0.1", port=redis_server.port, socket_timeout=2, retry=Retry(NoBackoff(), 0)
    )
    with pytest.raises((redis.AuthenticationError, redis.ResponseError), match="NOAUTH|auth"):
        anonymous.ping()
    url = redis_server.url
    no_password = url.replace(f":{redis_server.password}@", "")
    with pytest.raises(BufferUnavailable, match="requires a password"):
        connect(no_password, timeout_s=1.0)
    wrong = url.replace(redis_server.password, "wrong-password")
    with pytest.raises(BufferUnavailable, match="refused the password") as err:
        connect(wrong, timeout_s=1.0)
    assert "wrong-password" not in str(err.value) and ":***@" in str(err.value)


def _non_loopback_ip() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # UDP connect sends nothing; it picks a route
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


def test_server_binds_loopback_only(redis_server, redis_client):
    assert redis_client.config_get("bind")["bind"] == "127.0.0.1"
    assert redis_client.config_get("protected-mode")["protected-mode"] == "yes"
    assert redis_client.config_get("appendonly")["appendonly"] == "yes"
    assert redis_client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
    for path in (redis_server.conf_path, redis_server.run_dir / "redis.url"):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    ip = _non_loopback_ip()
    if ip is not None:  # no other interface on this machine: the config check above stands
        with pytest.raises(OSError):
            socket.create_connection((ip, redis_server.port), timeout=1.0).close()


def test_unreachable_url_names_masked_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket closes
    with pytest.raises(BufferUnavailable, match=rf"redis://:\*\*\*@127.0.0.1:{port}/0") as err:
        connect(f"redis://:hunter2@127.0.0.1:{port}/0", timeout_s=0.3)
    assert "hunter2" not in str(err.value) and "apt-get install -y redis-server" in str(err.value)


def test_missing_binary_says_how_to_install(tmp_path):
    with pytest.raises(RedisServerError, match="apt-get install -y redis-server"):
        RedisServer(tmp_path, RedisOptions(executable="redis-server-not-installed")).start()


def test_unix_socket_server(tmp_path, redis_binary):
    with RedisServer(tmp_path, RedisOptions(unix_socket=True)) as server:
        assert server.url.startswith("unix://:") and server.url.endswith("redis.sock?db=0")
        client = connect(server.url)
        assert client.config_get("port")["port"] == "0"  # no TCP listener at all
        buf = ReplayBuffer(client, "u", capacity=1)
        assert buf.commit(buf.lease(0, 1.0), _group("0:1"))


def test_restart_keeps_data_and_clients_reconnect(tmp_path, redis_binary):
    server = RedisServer(tmp_path).start()
    url = server.url
    buf = ReplayBuffer(connect(url), "r", capacity=4)
    _fill(buf, ["0:1", "0:2"])
    server.stop()
    restarted = RedisServer(tmp_path)
    threading.Timer(0.3, restarted.start).start()
    assert buf.stats()["unread"] == 2  # retried through the outage; AOF kept the entries
    assert restarted.url == url  # same password and port: clients' URL stays valid
    assert [e.group.group_id for e in buf.read("c", 5, 0)] == ["0:1", "0:2"]
    restarted.stop()
    with pytest.raises(BufferUnavailable, match=r"redis://:\*\*\*@127.0.0.1") as err:
        ReplayBuffer(
            buf.client, "r", capacity=4, options=BufferOptions(reconnect_s=0.3)
        )  # contacts Redis at once
    assert restarted.password not in str(err.value)


def _sigkill(server: RedisServer) -> None:
    os.kill(server.pid, signal.SIGKILL)
    server._proc.wait(timeout=10)


def test_an_aof_torn_inside_a_script_loads_the_same_twice(tmp_path, redis_binary):
    """A crash that tears the AOF inside a commit script's MULTI/EXEC: the torn commit is
    gone, and stays gone after the next restart. redis-server 7.0 alone truncated inside the
    MULTI and ran the torn script's HINCRBY at the next load: ``committed`` one above the
    stream (``RedisServer._retire_torn_aof`` rewrites the AOF after such a load)."""
    server = RedisServer(tmp_path).start()
    buf = ReplayBuffer(connect(server.url), "t", capacity=16)
    _fill(buf, ["0:1", "0:2", "0:3"])
    _sigkill(server)
    (incr,) = (tmp_path / "appendonlydir").glob("*.incr.aof")
    data = incr.read_bytes()
    incr.write_bytes(data[: data.rindex(b"XADD") + 2])  # torn inside the last script's effects
    server.start()
    assert (buf.stats()["committed"], buf.stats()["unread"]) == (2, 2)
    _fill(buf, ["0:4", "0:5"])
    _sigkill(server)
    server.start()
    stats = buf.stats()
    assert (stats["committed"], stats["unread"]) == (4, 4), stats
    assert buf.client.xlen("t") == 4
    server.stop()


def test_a_stop_request_ends_the_reconnect_retries_within_a_second(tmp_path, redis_binary):
    """A role told to stop while its Redis is gone (both die with a SIGKILLed launcher) leaves
    at once instead of retrying for ``reconnect_s``: the CI failure of stop 21, where the
    actor and the learner outlived their launcher by 60 s."""
    server = RedisServer(tmp_path).start()
    stopping = threading.Event()
    buf = ReplayBuffer(connect(server.url), "r", capacity=4, options=BufferOptions(reconnect_s=60.0), stop=stopping.is_set)  # fmt: skip
    _fill(buf, ["0:1"])
    server.stop()
    threading.Timer(0.5, stopping.set).start()
    t0 = time.monotonic()
    with pytest.raises(BufferUnavailable, match="while stopping"):
        buf.stats()  # retrying until the stop request
    took = time.monotonic() - t0
    assert 0.4 < took < 2.0, f"gave up after {took:.1f}s"
    t0 = time.monotonic()
    with pytest.raises(BufferUnavailable, match="while stopping"):
        buf.stats()  # already stopping: no retry at all
    assert time.monotonic() - t0 < 0.5


def test_corrupt_aof_stops_startup(tmp_path, redis_binary):
    with RedisServer(tmp_path) as server:
        buf = ReplayBuffer(connect(server.url), "a", capacity=4)
        _fill(buf, ["0:1"])
    incr = next((tmp_path / "appendonlydir").glob("*.incr.aof"))
    data = incr.read_bytes()
    incr.write_bytes(data[:20] + b"garbage\r\n" + data[20:])
    with pytest.raises(RedisServerError, match="Bad file format reading the append only file"):
        RedisServer(tmp_path).start()


def test_encoded_payload_is_what_is_stored(redis_client, buffer_name):
    buf = ReplayBuffer(redis_client, buffer_name, capacity=1)
    g = _group("5:5")
    buf.commit(buf.lease(5, 1.0), g)
    [(_, fields)] = redis_client.xrange(buffer_name)
    assert fields == {b"group_id": b"5:5", b"seq": b"1", b"payload": encode_group(g)}


def test_a_read_whose_reply_was_lost_is_recovered(redis_client, buffer_name):
    """Redis ran XREADGROUP but the connection dropped before the reply: the entries are
    pending for the consumer and nobody holds them. The next read hands them out (once)."""
    buf = ReplayBuffer(
        redis_client, buffer_name, capacity=8, options=BufferOptions(reconnect_s=2.0)
    )
    _fill(buf, [f"0:{i}" for i in range(5)])
    first = buf.read("c0", count=1, block_ms=100, vocab_size=100)
    real, lost = redis_client.xreadgroup, []

    def drop_reply(*args, **kwargs):
        reply = real(*args, **kwargs)  # the server delivered these entries...
        if not lost:
            lost.append(reply)
            raise redis.ConnectionError("connection dropped before the reply")  # ...lost here
        return reply

    redis_client.xreadgroup = drop_reply
    try:
        second = buf.read("c0", count=2, block_ms=100, vocab_size=100)
    finally:
        del redis_client.xreadgroup
    assert lost, "the fault was not injected"
    rest = buf.read("c0", count=10, block_ms=100, vocab_size=100)
    got = [e.group.group_id for e in first + second + rest]
    assert sorted(got) == [f"0:{i}" for i in range(5)], got  # every group once, none stranded
    buf.ack([e.entry_id for e in first + second + rest], "trained")
    s = buf.stats()
    assert s["trained"] == 5 and s["pending"] == 0 and _conserved(s)


def test_a_stop_set_after_construction_reaches_every_retry(redis_client, buffer_name):
    """actors/main.py sets ``buffer.stop`` once the actor exists: the store's retries (and so
    the reads') must see it, or a stopping actor keeps retrying a dead Redis."""
    buf = ReplayBuffer(redis_client, buffer_name, capacity=2)
    stopping = lambda: True  # noqa: E731
    buf.stop = stopping
    assert buf.stop is stopping and buf.store.stop is stopping and buf.reads.store is buf.store
    assert (buf.client, buf.name, buf.capacity) == (redis_client, buffer_name, 2)
