"""One buffer, one learner (buffer/learner_claim.py; a second learner on a buffer
took the first one's groups and reset its version), on a real redis-server."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from asyncrl.buffer.learner_claim import ClaimRefused, LearnerClaim, claim_key

pytestmark = pytest.mark.redis


def _name() -> str:
    return f"claim-{uuid.uuid4().hex[:10]}"


def test_another_run_is_refused_naming_the_holder(redis_client, tmp_path):
    name = _name()
    first = LearnerClaim(redis_client, name, str(tmp_path / "a"))
    first.acquire()
    second = LearnerClaim(redis_client, name, str(tmp_path / "b"))
    with pytest.raises(ClaimRefused) as refused:
        second.acquire()
    text = str(refused.value)
    assert f"buffer {name!r} already has a learner: pid" in text
    assert f"run_dir {tmp_path / 'a'}" in text and "its lease ends in 30 s" in text
    assert "give this one its own buffer.name" in text
    first.release()
    second.acquire()  # released: free again
    assert json.loads(redis_client.get(claim_key(name)))["run_dir"] == str(tmp_path / "b")


def test_the_same_run_takes_over_and_the_old_holder_can_neither_renew_nor_release(
    redis_client, tmp_path
):
    name = _name()
    old = LearnerClaim(redis_client, name, str(tmp_path / "run"))
    old.acquire()
    said: list[str] = []
    new = LearnerClaim(redis_client, name, str(tmp_path / "run"))
    new.acquire(said.append)
    assert "took over the claim" in said[0]
    assert not old.renew() and new.renew()
    old.release()  # not its claim any more: nothing is deleted
    assert json.loads(redis_client.get(claim_key(name)))["token"] == new.token


def test_a_dead_holders_lease_runs_out_and_a_kept_claim_does_not(redis_client, tmp_path):
    name = _name()
    dead = LearnerClaim(redis_client, name, str(tmp_path / "a"), ttl_s=0.5)
    dead.acquire()  # never renewed: as if SIGKILLed
    alive = LearnerClaim(redis_client, _name(), str(tmp_path / "c"), ttl_s=0.5)
    alive.acquire()
    lost: list[str] = []
    alive.keep(lost.append)
    time.sleep(1.2)
    LearnerClaim(redis_client, name, str(tmp_path / "b")).acquire()  # expired: taken
    with pytest.raises(ClaimRefused):
        LearnerClaim(redis_client, alive.name, str(tmp_path / "d")).acquire()
    redis_client.delete(claim_key(alive.name))  # taken away under it
    time.sleep(0.6)
    assert lost and "was lost" in lost[0]
    alive.release()
