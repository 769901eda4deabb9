"""Actor ids claimed in a real Redis (buffer/actor_ids.py): launches on different hosts never
share an id, a relaunch gets its own ids back, a dead launch's ids free up after the TTL, and
a launch whose id was taken learns it at its next renewal and stops, naming the ids; a launch
that stops releases its ids at once. The actor ACL user can do it all."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from asyncrl.buffer.actor_ids import ActorIds, launch_token
from asyncrl.core.config.load import load_config
from asyncrl.orchestration.launch.actor_ids import IdKeeper, interrupted

pytestmark = pytest.mark.redis


def _ids(client, name, token, total=4, ttl_s=30.0) -> ActorIds:
    return ActorIds(client, name, total, token, ttl_s)


def test_two_launches_split_the_ids_and_a_third_gets_none(redis_client, buffer_name):
    a, b, c = (_ids(redis_client, buffer_name, t) for t in ("A", "B", "C"))
    assert a.claim(2) == [0, 1]
    assert b.claim(2) == [2, 3]
    assert c.claim(2) == []  # all four held
    assert a.claim(2) == [0, 1]  # a relaunch of A: its own ids, not others'
    assert a.holders() == {0: "A", 1: "A", 2: "B", 3: "B"}


def test_fewer_ids_release_the_rest(redis_client, buffer_name):
    a, b = _ids(redis_client, buffer_name, "A"), _ids(redis_client, buffer_name, "B")
    assert a.claim(3) == [0, 1, 2]
    assert a.claim(1) == [0]  # relaunched with actor.num_actors=1: ids 1, 2 free again
    time.sleep(0.01)
    assert b.claim(3) == [1, 2, 3]


def test_a_dead_launchs_ids_free_up_after_the_ttl_and_renew_reports_theft(
    redis_client, buffer_name
):
    a = _ids(redis_client, buffer_name, "A", ttl_s=0.3)
    b = _ids(redis_client, buffer_name, "B", ttl_s=30)
    assert a.claim(4) == [0, 1, 2, 3]
    assert b.claim(2) == []
    time.sleep(0.5)  # A stopped renewing (its host died, or was cut off)
    assert b.claim(2) == [0, 1]
    assert a.renew([0, 1, 2, 3]) == [0, 1]  # A is back: 0 and 1 are B's now, 2 and 3 retaken
    assert a.holders() == {0: "B", 1: "B", 2: "A", 3: "A"}


def test_release_frees_only_the_ids_this_token_still_holds(redis_client, buffer_name):
    a = _ids(redis_client, buffer_name, "A", ttl_s=0.3)
    b = _ids(redis_client, buffer_name, "B")
    assert a.claim(2) == [0, 1]
    time.sleep(0.5)  # A was cut off: its ids expired, and B took id 0
    assert b.claim(1) == [0]
    assert a.renew([1]) == []  # A got id 1 back
    assert a.release([0, 1]) == [1]
    assert a.holders() == {0: "B"}


def _keeper(url, buffer_name, run_dir, said, ttl_s=30.0) -> IdKeeper:
    cfg = load_config([f"buffer.name={buffer_name}", "actor.num_actors=2", "actor.nnodes=2",
                       f"buffer.lease_ttl_s={ttl_s}"])  # fmt: skip
    run_dir.mkdir()
    return IdKeeper(cfg, url, run_dir, said.append)


def test_a_stopped_launch_releases_its_ids_at_once(
    redis_server, redis_client, buffer_name, tmp_path
):
    said: list[str] = []
    keeper = _keeper(redis_server.url, buffer_name, tmp_path / "a", said)
    assert keeper.claim() == [0, 1]
    keeper.close()
    assert not said
    # another launch gets them at once, not after buffer.lease_ttl_s (30 s)
    assert _ids(redis_client, buffer_name, "B").claim(2) == [0, 1]


def test_a_launch_whose_id_was_taken_stops_naming_the_ids(
    redis_server, redis_client, buffer_name, tmp_path
):
    said: list[str] = []
    keeper = _keeper(redis_server.url, buffer_name, tmp_path / "a", said, ttl_s=0.3)
    assert keeper.claim() == [0, 1]
    redis_client.set(f"{buffer_name}:actor_id:1", "B")  # another launch took id 1
    stopped = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stopped.set())  # the launcher's, here
    try:
        assert stopped.wait(5.0), said
    finally:
        signal.signal(signal.SIGTERM, previous)
    code, reason = interrupted(keeper, "interrupted (Ctrl-C or SIGTERM)")
    assert keeper.lost == [1] and code == 1
    assert "actor id(s) [1] were taken by another launch" in reason and reason in said[0]
    keeper.close()  # releases id 0 only
    assert not redis_client.get(f"{buffer_name}:actor_id:0")  # free
    assert redis_client.get(f"{buffer_name}:actor_id:1") == b"B"
    assert interrupted(None, "interrupted") == (130, "interrupted")


def test_the_actor_acl_user_can_claim_and_release(redis_server, buffer_name, tmp_path):
    from asyncrl.buffer.connection import connect
    from asyncrl.buffer.service.server import RedisServer

    server = RedisServer(redis_server.run_dir.parent / f"acl-{buffer_name}", key_prefix=buffer_name)
    said: list[str] = []
    with server:
        client = connect(server.url_for("actor"))
        ids = _ids(client, buffer_name, "A")
        assert ids.claim(2) == [0, 1] and ids.renew([0, 1]) == []
        assert ids.release([0, 1]) == [0, 1]
        keeper = _keeper(server.url_for("actor"), buffer_name, tmp_path / "k", said)
        assert keeper.claim() == [0, 1]
    # Redis is gone: the release fails in one line, bounded, and the ids expire with their TTL
    start = time.monotonic()
    keeper.close(timeout_s=1.0)
    assert time.monotonic() - start < 5.0
    assert len(said) == 1 and "could not release actor ids [0, 1]" in said[0], said


def test_launch_token_is_kept_in_a_private_file(tmp_path):
    token = launch_token(tmp_path)
    assert launch_token(tmp_path) == token and len(token) == 32
    assert os.stat(tmp_path / "actor_ids.token").st_mode & 0o777 == 0o600


def test_launches_get_their_own_ids_back_after_their_leases_lapsed(redis_client, buffer_name):
    """A requeued Slurm job may start again minutes after its launches lost their ids (their
    leases lapsed meanwhile): whatever order they start in, each takes the ids it held last,
    so its run directory's cursors stay its own; a launch new to the buffer takes the rest."""
    a = _ids(redis_client, buffer_name, "A", ttl_s=0.05)
    b = _ids(redis_client, buffer_name, "B", ttl_s=0.05)
    assert a.claim(2) == [0, 1] and b.claim(2) == [2, 3]
    time.sleep(0.1)  # both leases lapse
    assert a.holders() == {}
    assert b.claim(2) == [2, 3]  # B first this time: its own, not the lowest free ids
    assert a.claim(2) == [0, 1]
    time.sleep(0.1)
    c = _ids(redis_client, buffer_name, "C")
    assert c.claim(1) == [0]  # new: the lowest free id, whoever held it last
    assert a.claim(2) == [1, 2]  # its own id 1, then another free one
