"""One buffer, one learner (buffer/learner_claim.py; a second learner on a buffer
took the first one's groups and reset its version), on a real redis-server."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from asyncrl.buffer.learner_claim import (
    HELD_MEANWHILE,
    RENEWED,
    TAKEN,
    TAKEN_BACK,
    ClaimRefused,
    LearnerClaim,
    claim_key,
)

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
    assert old.renew() == TAKEN and new.renew() == RENEWED
    old.release()  # not its claim any more: nothing is deleted
    assert json.loads(redis_client.get(claim_key(name)))["token"] == new.token


def test_a_dead_holders_lease_runs_out_and_a_kept_claim_does_not(redis_client, tmp_path):
    name = _name()
    dead = LearnerClaim(redis_client, name, str(tmp_path / "a"), ttl_s=0.5)
    dead.acquire()  # never renewed: as if SIGKILLed
    alive = LearnerClaim(redis_client, _name(), str(tmp_path / "c"), ttl_s=0.5)
    alive.acquire()
    lost: list[str] = []
    alive.keep(lambda why, same: lost.append(why), say=lambda _: None)
    time.sleep(1.2)
    LearnerClaim(redis_client, name, str(tmp_path / "b")).acquire()  # expired: taken
    with pytest.raises(ClaimRefused):
        LearnerClaim(redis_client, alive.name, str(tmp_path / "d")).acquire()
    assert not lost
    alive.release()


def test_a_lapsed_claim_is_taken_back_and_training_goes_on(redis_client, tmp_path):
    """Round 4 of issue 43: Redis or the learner stalled longer than the lease (SIGSTOP
    for 30 s); nobody took the buffer meanwhile, so the learner keeps it (formerly: "lost",
    and the run ended early with exit 0)."""
    claim = LearnerClaim(redis_client, _name(), str(tmp_path / "run"), ttl_s=0.3)
    claim.acquire()
    redis_client.delete(claim.key)  # the lease lapsed while nothing could renew it
    assert claim.renew() == TAKEN_BACK
    assert json.loads(redis_client.get(claim.key))["token"] == claim.token
    assert 0 < redis_client.pttl(claim.key) <= 300
    assert claim.renew() == RENEWED
    said: list[str] = []
    lost: list[str] = []
    claim.keep(lambda why, same: lost.append(why), said.append)
    redis_client.delete(claim.key)
    deadline = time.monotonic() + 5
    while not said and time.monotonic() < deadline:
        time.sleep(0.05)
    assert said and "had lapsed" in said[0] and "taken back, training goes on" in said[0]
    assert not lost and json.loads(redis_client.get(claim.key))["token"] == claim.token
    claim.release()
    assert redis_client.get(claim.key) is None


def test_a_claim_another_learner_took_while_this_one_stalled_is_lost_naming_it(
    redis_client, tmp_path
):
    claim = LearnerClaim(redis_client, _name(), str(tmp_path / "a"), ttl_s=0.3)
    claim.acquire()
    lost: list[str] = []
    claim.keep(lambda why, same: lost.append((why, same)), say=lambda _: None)
    claim._stop.set()  # stalled: no renewal (a SIGSTOPped learner)
    claim._thread.join(2)
    time.sleep(0.5)  # the lease lapses ...
    other = LearnerClaim(redis_client, claim.name, str(tmp_path / "b"))
    other.acquire()  # ... and another run's learner takes the buffer
    claim._stop.clear()
    claim.keep(
        lambda why, same: lost.append((why, same)), say=lambda _: None
    )  # the learner runs again
    deadline = time.monotonic() + 5
    while not lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(lost) == 1, lost
    text, same = lost[0]
    assert not same
    assert f"the claim on buffer {claim.name!r} was taken by another learner" in text
    assert f"run_dir {tmp_path / 'b'}" in text and "stops with an error" in text
    claim.release()  # not its claim: the other learner keeps it
    assert json.loads(redis_client.get(claim.key))["token"] == other.token
    other.release()


def test_a_lapsed_claim_another_learner_held_meanwhile_is_not_taken_back(redis_client, tmp_path):
    """A stalls, its lease lapses, B takes the buffer, trains and lets go; A wakes and finds
    the key free: the epoch B's acquire counted says the buffer was not free all along."""
    a = LearnerClaim(redis_client, _name(), str(tmp_path / "a"), ttl_s=30)
    a.acquire()
    redis_client.delete(a.key)  # A's lease lapsed
    b = LearnerClaim(redis_client, a.name, str(tmp_path / "b"))
    b.acquire()
    assert b.epoch == a.epoch + 1
    b.release()
    assert redis_client.get(a.key) is None
    assert a.renew() == HELD_MEANWHILE and redis_client.get(a.key) is None


def test_a_restarted_learner_of_the_same_run_supersedes_the_stalled_one(redis_client, tmp_path):
    old = LearnerClaim(redis_client, _name(), str(tmp_path / "run"), ttl_s=0.3)
    old.acquire()
    LearnerClaim(redis_client, old.name, str(tmp_path / "run")).acquire()  # the restart
    lost: list[tuple[str, bool]] = []
    old.keep(lambda why, same: lost.append((why, same)), say=lambda _: None)
    deadline = time.monotonic() + 5
    while not lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lost and lost[0][1] and "a restarted learner of this run" in lost[0][0]
    old.release()


def test_release_waits_for_a_renewal_in_flight_so_a_finished_claim_stays_gone(
    redis_client, tmp_path
):
    claim = LearnerClaim(redis_client, _name(), str(tmp_path / "a"), ttl_s=0.06)
    claim.acquire()
    claim.keep(lambda why, same: None, say=lambda _: None)  # renews every 20 ms
    time.sleep(0.1)
    claim.release()
    assert not claim._thread.is_alive()
    time.sleep(0.1)
    assert redis_client.get(claim.key) is None
