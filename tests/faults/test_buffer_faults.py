"""Guarantee 4: backpressure. With the learner paused the buffer never exceeds its capacity,
producers block (no error, no drop, no LeaseExpired, processes alive) and resume when reading
resumes; nothing is lost or duplicated.

Producers are real processes (this file run as a script) doing what ``actors/actor.py`` does
around the buffer: ``lease(actor_id, 1.0)`` retried while the buffer is full, a short
"generation" holding the lease, then ``commit``. The learner side is this test process: it
pauses (reads nothing) and resumes (reads and acks as trained), several times, while it
samples ``stats()`` every few milliseconds.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from buffer.connection import connect
from buffer.redis_buffer import ReplayBuffer
from buffer.testing import random_group

pytestmark = [pytest.mark.faults, pytest.mark.redis]

CAPACITY = 6
VOCAB = 100
_TERMINAL = ("trained", "dropped_stale", "dropped_invalid", "dropped_poison", "dropped_uniform")
_REPO = Path(__file__).resolve().parents[2]


def _producer_main(url: str, name: str, actor_id: str, n_groups: str) -> int:
    """Commit ``n_groups`` groups, blocking on a full buffer; print one JSON summary line."""
    buf = ReplayBuffer(connect(url), name, CAPACITY, lease_ttl_s=30.0)
    rng = random.Random(int(actor_id))
    waits = 0
    for k in range(int(n_groups)):
        while (lease := buf.lease(int(actor_id), 1.0)) is None:  # full: backpressure
            waits += 1
        time.sleep(rng.uniform(0.0, 0.02))  # "generating" while holding the slot
        group = random_group(rng, f"{actor_id}:{k}", vocab_size=VOCAB, n=2, max_len=4)
        if not buf.commit(lease, group):  # LeaseExpired propagates: a test failure
            raise AssertionError(f"group {group.group_id} reported as a duplicate")
    print(json.dumps({"actor": int(actor_id), "committed": int(n_groups), "waits": waits}))
    return 0


def conserved(s: dict) -> bool:
    return s["committed"] == sum(s[k] for k in _TERMINAL) + s["unread"] + s["pending"]


class Sampler:
    """Samples stats() and checks the capacity and conservation invariants on each sample."""

    def __init__(self, buf: ReplayBuffer) -> None:
        self.buf, self.samples, self.max_used = buf, 0, 0

    def sample(self) -> dict:
        s = self.buf.stats()
        used = s["leased"] + s["unread"]
        assert used <= s["capacity"] == CAPACITY, f"over capacity: {s}"
        assert conserved(s), s
        self.samples += 1
        self.max_used = max(self.max_used, used)
        return s


@pytest.mark.timeout(180)
def test_backpressure_blocks_producers_and_loses_nothing(redis_server, counts):
    n_producers, per_producer = 3, counts(12, 40)
    cycles, pause_s = counts(2, 6), 2.5
    total = n_producers * per_producer
    name = f"backpressure-{os.getpid()}-{time.monotonic_ns()}"
    buf = ReplayBuffer(connect(redis_server.url), name, CAPACITY, lease_ttl_s=30.0)
    buf.stats()  # capacity published before the producers start
    env = dict(os.environ, PYTHONPATH=str(_REPO))
    url = redis_server.url_for("actor")  # producers use the least-privilege actor ACL user
    cmd = [sys.executable, __file__, url, name]
    procs = [
        subprocess.Popen(
            cmd + [str(i), str(per_producer)],
            env=env,
            cwd=_REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in range(n_producers)
    ]
    try:
        sampler, delivered, stalls = Sampler(buf), [], []
        t0 = time.monotonic()
        for cycle in range(cycles):
            stalls.append(_pause(sampler, procs, pause_s, cycle))
            _resume(sampler, buf, delivered, want=min(total, (cycle + 1) * total // cycles))
        _resume(sampler, buf, delivered, want=total)
        outs = [p.communicate(timeout=60) for p in procs]
        elapsed = time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, f"producer failed (rc {p.returncode}):\n{err[-3000:]}"
        assert "LeaseExpired" not in err, err[-3000:]
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert sum(r["waits"] for r in reports) > 0, "producers never blocked"
    want = sorted(f"{a}:{k}" for a in range(n_producers) for k in range(per_producer))
    assert sorted(delivered) == want, "every committed group delivered exactly once"
    s = sampler.sample()
    assert (s["committed"], s["trained"], s["unread"], s["pending"], s["leased"]) == (
        total, total, 0, 0, 0,
    ), s  # fmt: skip
    print(f"\nbackpressure: {n_producers} producers, {total} groups, {cycles} pauses of "
          f"{pause_s}s (committed frozen at {stalls}), {sampler.samples} stats samples, "
          f"max leased+unread {sampler.max_used}/{CAPACITY}, {elapsed:.1f}s")  # fmt: skip


def _pause(sampler: Sampler, procs: list, pause_s: float, cycle: int) -> int:
    """Read nothing: the buffer fills (producers may still be starting), then committed must
    stay frozen for ``pause_s``."""
    end = time.monotonic() + 30
    while time.monotonic() < end:  # bounded by time
        s = sampler.sample()
        if s["unread"] == CAPACITY:
            break
        time.sleep(0.005)
    assert s["unread"] == CAPACITY, f"pause {cycle}: buffer never filled: {s}"
    frozen = s["committed"]
    end = time.monotonic() + pause_s
    while time.monotonic() < end:
        s = sampler.sample()
        assert s["committed"] == frozen, f"pause {cycle}: committed grew on a full buffer: {s}"
        assert s["leased"] == 0, f"pause {cycle}: a lease was granted on a full buffer: {s}"
        failed = [(p.args[4], p.returncode) for p in procs if p.poll() not in (None, 0)]
        assert not failed, f"pause {cycle}: producers (actor, rc) {failed} died while blocked"
        assert any(p.poll() is None for p in procs), f"pause {cycle}: no producer is blocked"
        time.sleep(0.01)
    return frozen


def _resume(sampler: Sampler, buf: ReplayBuffer, delivered: list, want: int) -> None:
    """Read and ack (trained) until ``want`` groups were delivered in total."""
    deadline = time.monotonic() + 60
    while len(delivered) < want:
        assert time.monotonic() < deadline, f"producers did not resume: {sampler.sample()}"
        entries = buf.read("learner", count=2, block_ms=200, vocab_size=VOCAB)
        delivered += [e.group.group_id for e in entries]
        buf.ack([e.entry_id for e in entries], "trained")
        sampler.sample()


if __name__ == "__main__":
    sys.exit(_producer_main(*sys.argv[1:5]))
