"""Stalls longer than the learner's buffer claim lease (``buffer.claim_ttl_s``, 12 s here;
buffer/learner_claim.py), on a whole job: ``asyncrl run`` with the simulated engine, its real
redis-server and learner rank.

Issue 43 round 4: SIGSTOP of redis-server for 30 s, or of the learner rank for 40 s, ended the
run early with ``[asyncrl] done.`` and exit 0 (the lapsed claim was handled as a stop). Now a
lapsed claim nobody took is taken back and training goes on; a claim another learner took
while this one was stalled fails the run, non-zero, naming the holder.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import psutil
import pytest

from asyncrl.buffer.connection import connect
from asyncrl.buffer.learner_claim import LearnerClaim
from tests.faults.test_job_lifecycle import SIM, _role_pid

pytestmark = [pytest.mark.faults, pytest.mark.redis, pytest.mark.slow]

TTL_S = 12.0
STALL_S = TTL_S + 5.0  # longer than the lease: the claim's key expires meanwhile


def _steps(out: str) -> int:
    """The newest step number the launcher printed (0 before the first)."""
    found = re.findall(r"^step +(\d+) \|", out, re.M)
    return int(found[-1]) if found else 0


def _redis_pid(run_dir) -> int:
    port = (run_dir / "redis" / "redis.url").read_text().strip().rsplit(":", 1)[1].split("/")[0]
    for p in psutil.process_iter(["name", "cmdline"]):
        if p.info["name"] == "redis-server" and f":{port}" in " ".join(p.info["cmdline"] or []):
            return p.pid
    raise AssertionError(f"no redis-server on port {port}")


def _stall(pid: int, seconds: float) -> None:
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


def _trains_on(roles, job, after: int, what: str) -> int:
    """Wait for steps past ``after`` (the run was not ended by the stall); the newest step."""
    roles.wait_until(lambda: _steps(job.output()) > after + 2, 180, f"steps after {what}")
    return _steps(job.output())


@pytest.mark.timeout(900)
def test_stalls_longer_than_the_claim_lease_keep_training_and_a_taken_claim_fails(tmp_path, roles):
    run_dir = tmp_path / "run"
    job = roles.cli("job", "run", *SIM, "learner.steps=100000", "learner.nproc=1",
                    f"buffer.claim_ttl_s={TTL_S}", f"run_dir={run_dir}")  # fmt: skip
    roles.wait_until(lambda: _steps(job.output()) >= 2, 300, "a second step")

    # Redis stops answering for longer than the lease: the key lapses; nobody takes it
    _stall(_redis_pid(run_dir), STALL_S)
    roles.wait_line(job, "taken back, training goes on", 60)  # at its next renewal (4 s)
    step = _trains_on(roles, job, _steps(job.output()), "a Redis stall")
    out = job.output()
    assert "[asyncrl] done" not in out and "must stop" not in out, out[-4000:]

    # the learner rank stops for longer than the lease: the same from its side
    said = out.count("taken back, training goes on")
    _stall(_role_pid(run_dir, "asyncrl.learner.main"), STALL_S)
    roles.wait_until(lambda: job.output().count("taken back, training goes on") > said, 60,
                     "the learner to take its lapsed claim back")  # fmt: skip
    _trains_on(roles, job, step, "a learner stall")

    # stalled again, and this time another run's learner takes the buffer meanwhile
    name = json.loads((run_dir / "config.json").read_text())["buffer"]["name"]
    client = connect((run_dir / "redis" / "redis.url").read_text().strip(), timeout_s=10.0)
    learner = _role_pid(run_dir, "asyncrl.learner.main")
    os.kill(learner, signal.SIGSTOP)
    try:
        time.sleep(STALL_S)
        other = LearnerClaim(client, name, str(tmp_path / "other-run"), TTL_S)
        other.acquire()  # the lease had lapsed: another learner may take it
    finally:
        os.kill(learner, signal.SIGCONT)
    code = roles.wait(job, 180)
    out = job.output()
    assert code not in (0, None), out[-4000:]
    assert f"the claim on buffer {name!r} was taken by another learner" in out, out[-4000:]
    assert f"run_dir {os.path.realpath(tmp_path / 'other-run')}" in out, out[-4000:]
    assert "[asyncrl] done" not in out, out[-4000:]
    client.close()
