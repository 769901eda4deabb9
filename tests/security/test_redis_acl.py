"""The auto-started Redis requires a password, and its least-privilege ACL users (``actor``,
``learner``; ``asyncrl.buffer.service.files.ROLE_USERS``) can do exactly what their role needs."""

from __future__ import annotations

import random
import shutil
import socket

import pytest
import redis

from asyncrl.buffer.connection import BufferUnavailable, connect
from asyncrl.buffer.cursors import PromptCursor, SyncQuota
from asyncrl.buffer.redis_buffer import ReplayBuffer
from asyncrl.buffer.service.server import RedisOptions, RedisServer
from asyncrl.buffer.testing import random_group

pytestmark = pytest.mark.redis
NAME = "acljob"
ADMIN_ONLY = [("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "SET", "dir", "/tmp"), ("SHUTDOWN",),
              ("KEYS", "*"), ("ACL", "LIST"), ("MODULE", "LIST"),
              ("MONITOR",), ("SCRIPT", "FLUSH"), ("CLIENT", "KILL", "TYPE", "normal")]  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if shutil.which("redis-server") is None:
        pytest.skip("install redis-server (apt-get install -y redis-server) to run Redis tests")
    with RedisServer(tmp_path_factory.mktemp("acl"), key_prefix=NAME) as s:
        yield s


def _denied(client: redis.Redis, *cmd) -> bool:
    try:
        client.execute_command(*cmd)
    except redis.exceptions.NoPermissionError:
        return True
    return False


def test_unauthenticated_and_wrong_password_are_refused(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"PING\r\nGET x\r\n")
        reply = s.recv(4096)
    assert reply.startswith(b"-NOAUTH"), reply
    with pytest.raises(BufferUnavailable, match="requires a password"):
        connect(f"redis://127.0.0.1:{server.port}/0", timeout_s=2)
    with pytest.raises(BufferUnavailable, match="refused the password"):
        connect(f"redis://actor:wrong@127.0.0.1:{server.port}/0", timeout_s=2)


def test_actor_user_can_produce_but_not_consume_or_administer(server):
    admin = connect(server.url)
    actor = connect(server.url_for("actor"))
    buf = ReplayBuffer(actor, NAME, capacity=8)
    lease = buf.lease(actor_id=0, timeout_s=1)
    assert lease and buf.renew(lease)
    assert buf.commit(lease, random_group(random.Random(0), "g0"))
    spare = buf.lease(actor_id=0, timeout_s=1)
    assert buf.release(spare)
    assert buf.stats()["committed"] == 1 and buf.learner_version() == -1
    assert buf.meta()["capacity"] == "8"
    assert SyncQuota(buf, per_version=1).take(0)  # sync-mode quota
    cursor = PromptCursor(buf, actor_id=0, num_actors=1, end=None)  # the prompt cursor
    assert cursor.next() == 0 and cursor.in_flight() == [0] and cursor.claimed() == 1
    cursor.done(0)
    actor.hset(f"{NAME}:endpoints", "actor0", "127.0.0.1:1")  # metrics endpoint
    # Not the actor's business: consuming, acking, deleting, other jobs' keys, admin.
    with pytest.raises(redis.exceptions.NoPermissionError):
        buf.read("learner0", count=1, block_ms=0)
    (eid, _), = admin.xrange(NAME)  # fmt: skip
    assert _denied(actor, "XACK", NAME, "learner", eid)
    assert _denied(actor, "XDEL", NAME, eid)
    assert _denied(actor, "DEL", NAME)
    assert _denied(actor, "SET", "otherjob:x", "1") and _denied(actor, "GET", "otherjob:x")
    for cmd in ADMIN_ONLY:
        assert _denied(actor, *cmd), cmd
    assert admin.xlen(NAME) == 1, "the entry must still be there"


def test_learner_user_can_consume_but_not_administer(server):
    admin = connect(server.url)
    learner = connect(server.url_for("learner"))
    buf = ReplayBuffer(learner, NAME, capacity=8)
    admin.xadd(NAME, {b"junk": b"1"})  # a foreign entry: dead-lettered by read()
    entries = buf.read("learner0", count=8, block_ms=0)
    assert [e.group.group_id for e in entries] == ["g0"]
    assert [e.entry_id for e in buf.read_pending("learner0")] == [entries[0].entry_id]
    buf.set_deliveries("learner0", {entries[0].entry_id: 2})  # XCLAIM RETRYCOUNT (poison count)
    assert buf.ack([e.entry_id for e in entries], "trained") == 1
    assert len(buf.dead_letters()) == 1
    buf.set_learner_version(3)
    buf.set_meta(max_staleness=2)
    s = buf.stats()
    assert s["trained"] == 1 and s["dropped_invalid"] == 1 and s["unread"] == s["pending"] == 0
    assert _denied(learner, "SET", "otherjob:x", "1")
    for cmd in ADMIN_ONLY:
        assert _denied(learner, *cmd), cmd


def test_restart_keeps_user_passwords(server):
    again = RedisServer(server.run_dir, key_prefix=NAME)
    assert again.user_passwords == server.user_passwords and again.password == server.password


def test_role_users_on_a_unix_socket(tmp_path):
    """``url_for`` also works for a unix-socket server (the user travels in the URL)."""
    if shutil.which("redis-server") is None:
        pytest.skip("install redis-server (apt-get install -y redis-server) to run Redis tests")
    with RedisServer(tmp_path, RedisOptions(unix_socket=True), key_prefix=NAME) as s:
        actor = connect(s.url_for("actor"))
        assert actor.set(f"{NAME}:k", "1") and _denied(actor, "FLUSHALL")
        assert (tmp_path / "redis.actor.url").read_text().startswith("unix://actor:")
