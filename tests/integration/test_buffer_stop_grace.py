"""``asyncrl launch buffer`` asked to stop serves on while its job's learner or actors hold the
buffer (orchestration/launch/buffer_start.py ``serve_until_released``, buffer/service/holders.py):
a scheduler signals every role at once, and the learner still needs Redis for its last
checkpoint's acks and ``summary.json``. Real Redis, the real claim and id keys."""

from __future__ import annotations

import threading
import time

import pytest

from asyncrl.buffer.actor_ids import ActorIds
from asyncrl.buffer.learner_claim import LearnerClaim
from asyncrl.buffer.service.holders import holders
from asyncrl.orchestration.launch.buffer_start import serve_until_released

pytestmark = pytest.mark.redis


def test_holders_name_the_learner_and_the_held_actor_ids(redis_client, buffer_name, tmp_path):
    assert holders(redis_client, buffer_name) == []
    claim = LearnerClaim(redis_client, buffer_name, str(tmp_path))
    claim.acquire()
    ids = ActorIds(redis_client, buffer_name, 4, "tok", 30.0)
    assert ids.claim(3) == [0, 1, 2]
    found = holders(redis_client, buffer_name)
    assert found[0].startswith("the learner (host ") and found[1] == "actor ids [0, 1, 2]", found
    ids.release([0, 1])
    time.sleep(0.01)  # a released id is '' for a millisecond
    claim.release()
    assert holders(redis_client, buffer_name) == ["actor ids [2]"]
    ids.release([2])
    time.sleep(0.01)
    assert holders(redis_client, buffer_name) == []


def test_the_stop_waits_until_the_roles_let_go(redis_server, redis_client, buffer_name, capsys):
    ids = ActorIds(redis_client, buffer_name, 2, "tok", 30.0)
    ids.claim(2)
    threading.Timer(1.5, ids.release, args=([0, 1],)).start()
    t0 = time.monotonic()
    serve_until_released(redis_server.url, buffer_name, grace_s=20.0, poll_s=0.1)
    took = time.monotonic() - t0
    assert 1.4 < took < 5, took
    out = capsys.readouterr().out
    assert "serving until actor ids [0, 1] let go (at most 20s" in out, out
    assert "still hold" not in out, out


def test_the_stop_gives_up_after_the_grace_naming_what_still_holds(
    redis_server, redis_client, buffer_name, capsys
):
    ActorIds(redis_client, buffer_name, 1, "tok", 30.0).claim(1)
    t0 = time.monotonic()
    serve_until_released(redis_server.url, buffer_name, grace_s=1.0, poll_s=0.1)
    assert time.monotonic() - t0 < 3
    assert "stopping while actor ids [0] still hold(s) it" in capsys.readouterr().out


def test_nothing_held_or_no_grace_stops_at_once(redis_server, redis_client, buffer_name, capsys):
    t0 = time.monotonic()
    serve_until_released(redis_server.url, buffer_name, grace_s=20.0)
    ActorIds(redis_client, buffer_name, 1, "tok", 30.0).claim(1)
    serve_until_released(redis_server.url, buffer_name, grace_s=0.0)
    assert time.monotonic() - t0 < 2
    assert capsys.readouterr().out == ""
