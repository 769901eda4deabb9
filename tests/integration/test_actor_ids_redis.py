"""Actor ids claimed in a real Redis (buffer/actor_ids.py): launches on different hosts never
share an id, a relaunch gets its own ids back, a dead launch's ids free up after the TTL, and
a launch whose id was taken learns it at its next renewal. The actor ACL user can do it all."""

from __future__ import annotations

import os
import time

import pytest

from buffer.actor_ids import ActorIds, launch_token

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


def test_the_actor_acl_user_can_claim(redis_server, buffer_name):
    from buffer.connection import connect
    from buffer.server import RedisServer

    server = RedisServer(redis_server.run_dir.parent / f"acl-{buffer_name}", key_prefix=buffer_name)
    with server:
        client = connect(server.url_for("actor"))
        ids = _ids(client, buffer_name, "A")
        assert ids.claim(2) == [0, 1] and ids.renew([0, 1]) == []


def test_launch_token_is_kept_in_a_private_file(tmp_path):
    token = launch_token(tmp_path)
    assert launch_token(tmp_path) == token and len(token) == 32
    assert os.stat(tmp_path / "actor_ids.token").st_mode & 0o777 == 0o600
