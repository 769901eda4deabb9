"""Guarantee 4: backpressure. With the learner paused the buffer never exceeds its capacity,
actors block (no error, no drop, no LeaseExpired, processes alive) and resume when reading
resumes; nothing is lost or duplicated.

The producers are real actor processes (``python -m asyncrl.actors.main``, simulated engine) against a
real redis-server, more of them in flight than the buffer has slots. The learner side is this
test process (the learner's control plane is a real ZeroMQ server announced in the buffer's
meta): it pauses (reads nothing) and resumes (reads, checks each group is complete, acks as
trained), several times, while it samples ``stats()`` every few milliseconds.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from asyncrl.buffer.redis_buffer import BufferOptions, ReplayBuffer
from asyncrl.core.config.load import config_to_json
from tests.faults.test_actor_kills import N_SAMPLES, assert_conserved, spawn_actor, write_config
from tests.roles import Roles

pytestmark = [pytest.mark.faults, pytest.mark.redis]

CAPACITY = 6  # 3 actors x max_inflight 2 = 6 groups wanted at once; plus what is unread
LEASE_TTL_S = 30.0


class Sampler:
    """Samples stats() and checks the capacity and conservation invariants on each sample,
    and that no watched actor died (``roles.check``): every wait of the test samples."""

    def __init__(self, buf: ReplayBuffer, roles: Roles) -> None:
        self.buf, self.roles, self.samples, self.max_used = buf, roles, 0, 0

    def sample(self) -> dict:
        self.roles.check()
        s = self.buf.stats()
        used = s["leased"] + s["unread"]
        assert used <= s["capacity"] == CAPACITY, f"over capacity: {s}"
        assert_conserved(s)
        self.samples += 1
        self.max_used = max(self.max_used, used)
        return s


class Learner:
    """The learner's side of the buffer: reads (when not paused), checks, acks as trained."""

    def __init__(self, buf: ReplayBuffer, vocab: int) -> None:
        self.buf, self.vocab = buf, vocab
        self.seen: Counter[str] = Counter()
        self.partial: list[str] = []

    def read_until(self, sampler: Sampler, want: int, timeout_s: float = 60.0) -> None:
        """Read and ack until ``want`` groups were delivered in total."""
        deadline = time.monotonic() + timeout_s
        while sum(self.seen.values()) < want:
            assert time.monotonic() < deadline, f"actors did not resume: {sampler.sample()}"
            entries = self.buf.read("learner", count=2, block_ms=200, vocab_size=self.vocab)
            for e in entries:
                self.seen[e.group.group_id] += 1
                if len(e.group.samples) != N_SAMPLES:
                    self.partial.append(e.group.group_id)
            self.buf.ack([e.entry_id for e in entries], "trained")
            sampler.sample()


def pause(sampler: Sampler, pause_s: float, cycle: int) -> int:
    """Read nothing: the buffer fills, then committed must stay frozen for ``pause_s`` while
    every actor stays alive (the sampler checks). The first fill includes the actors' start (imports, tokenizer),
    which takes 10-30 s on a loaded 2-core machine; later fills take about a second."""
    end = time.monotonic() + (120 if cycle == 0 else 30)
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
        time.sleep(0.01)
    return frozen


@pytest.mark.timeout(240)
def test_backpressure_blocks_real_actors_and_loses_nothing(
    redis_server,
    redis_client,
    buffer_name,
    sim_model_dir,
    announced_learner,
    tmp_path,
    counts,
    roles,
):
    cycles, pause_s, per_resume = counts(2, 6), 2.5, counts(12, 30)
    run_dir = tmp_path / "run"
    cfg = write_config(run_dir, buffer_name, sim_tokens_per_s=400.0)
    cfg.buffer.capacity, cfg.buffer.lease_ttl_s = CAPACITY, LEASE_TTL_S
    (run_dir / "config.json").write_text(config_to_json(cfg))
    vocab = json.loads((Path(sim_model_dir) / "config.json").read_text())["vocab_size"]
    buf = ReplayBuffer(redis_client, buffer_name, CAPACITY, BufferOptions(lease_ttl_s=LEASE_TTL_S))
    buf.set_learner_version(0)
    url = redis_server.url_for("actor")  # actors use the least-privilege actor ACL user
    k = cfg.actor.num_actors
    procs = {i: spawn_actor(roles, run_dir, sim_model_dir, i, url) for i in range(k)}
    sampler, learner, stalls = Sampler(buf, roles), Learner(buf, vocab), []
    t0 = time.monotonic()
    try:
        for cycle in range(cycles):
            stalls.append(pause(sampler, pause_s, cycle))
            learner.read_until(sampler, sum(learner.seen.values()) + per_resume)
        for p in procs.values():  # a clean stop releases every lease it holds
            roles.release(p)
            p.popen.send_signal(signal.SIGTERM)
        codes = {i: roles.wait(p, 60) for i, p in procs.items()}
        learner.read_until(sampler, buf.stats()["committed"])
        elapsed = time.monotonic() - t0
    finally:
        roles.stop_all()
    logs = {i: (run_dir / f"actor{i}.log").read_text(errors="replace") for i in range(k)}
    assert codes == {i: 0 for i in range(k)}, f"actors did not exit cleanly: {codes}\n{logs}"
    for log in logs.values():
        assert "Traceback" not in log and "LeaseExpired" not in log, log[-3000:]
    assert not {g: c for g, c in learner.seen.items() if c > 1}, "a group delivered twice"
    assert not learner.partial, f"partial groups delivered: {learner.partial[:5]}"
    s = sampler.sample()
    assert (s["trained"], s["unread"], s["pending"], s["leased"]) == (
        s["committed"], 0, 0, 0,
    ), s  # fmt: skip
    assert s["committed"] == len(learner.seen) >= cycles * per_resume, s
    actors = [json.loads((run_dir / f"actor{i}.json").read_text()) for i in range(k)]
    assert sum(a["committed"] for a in actors) == s["committed"], actors
    blocked = [round(a["time_s"].get("waiting_buffer", 0.0), 1) for a in actors]
    assert all(b > 0 for b in blocked), f"an actor never waited for a slot: {blocked}"
    print(f"\nbackpressure: {k} real actors, {s['committed']} groups, {cycles} pauses of "
          f"{pause_s}s (committed frozen at {stalls}), {sampler.samples} stats samples, "
          f"max leased+unread {sampler.max_used}/{CAPACITY}, seconds each actor waited for "
          f"a slot {blocked}, {elapsed:.1f}s")  # fmt: skip
