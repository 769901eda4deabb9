"""Guarantee 5: staleness under skew (actors 10x faster than the learner, then 10x slower).

Real parts: redis-server and ``ReplayBuffer``, two ``asyncrl.actors.actor.Actor`` producers with the
simulated engine (real lease/claim/commit path, real admission control), and the learner's
real ``asyncrl.learner.hub.data.GroupSource`` (the staleness filter) in an in-test training loop that
advances the policy version once per batch. Weight sync is the one stand-in: a new version is
applied to the actors by setting it (as ``ControlPlane.update_weights`` does after a transfer), a
short while after the learner publishes it. A ledger wraps the buffer to record every
delivery and every ack, so each group's fate is checked individually.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.faults.conftest import FULL, fault_count
from tests.faults.test_actor_kills import assert_conserved

pytestmark = [pytest.mark.faults, pytest.mark.redis, pytest.mark.slow]

MAX_STALENESS = 1
BATCH = 4
N_SAMPLES = 4
CAPACITY = 16  # 4 batches: when actors outrun the learner, the queue ages past the bound
FAST_TOK_S, SLOW_TOK_S = 2000.0, 60.0  # actor speed (x2 actors), tokens/s each
SLOW_STEP_S, FAST_STEP_S = 1.0, 0.0  # learner pacing per batch


class Ledger:
    """A ``ReplayBuffer`` wrapper that records every delivered entry and every ack."""

    def __init__(self, buffer) -> None:
        self.buffer = buffer
        self.version = 0  # the learner's version while it reads (set by the loop)
        self.delivered: dict[str, tuple[str, int]] = {}  # entry id -> (group_id, version_min)
        self.acks: Counter[str] = Counter()
        self.stale: list[tuple[str, int]] = []  # (entry id, learner version when dropped)
        self.trained: list[str] = []

    def read(self, *args, **kwargs):
        entries = self.buffer.read(*args, **kwargs)
        for e in entries:
            assert e.entry_id not in self.delivered, f"{e.entry_id} delivered twice"
            self.delivered[e.entry_id] = (e.group.group_id, e.group.version_min)
        return entries

    def ack(self, ids, state):
        ids = list(ids)
        self.acks.update(ids)
        if state == "dropped_stale":
            self.stale += [(i, self.version) for i in ids]
        elif state == "trained":
            self.trained += ids
        return self.buffer.ack(ids, state)

    def __getattr__(self, name):
        return getattr(self.buffer, name)


class Producers(threading.Thread):
    """Two in-process actors (sim engine) on their own event loop, following the learner."""

    def __init__(self, cfg, buffer_factory, model_dir: str) -> None:
        super().__init__(daemon=True)
        self.cfg, self.buffer_factory, self.model_dir = cfg, buffer_factory, model_dir
        self.actors: list = []
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self.engines: list = []

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # surfaced by the test
            self.error = e
            self.ready.set()

    async def _main(self) -> None:
        from asyncrl.actors.actor import Actor
        from asyncrl.actors.data.addition import AdditionSource
        from asyncrl.actors.engine.sim import SimEngine
        from asyncrl.actors.rewards.loading import load_reward_fn

        reward = load_reward_fn(self.cfg.task.reward_fn)
        vocab = json.loads((Path(self.model_dir) / "config.json").read_text())["vocab_size"]
        for i in range(self.cfg.actor.num_actors):
            engine = SimEngine(vocab, FAST_TOK_S, 4.0, seed=i)
            buf = self.buffer_factory()
            prompts = AdditionSource(self.cfg.task.seed, split="train")
            self.actors.append(Actor(self.cfg, i, self.model_dir, buf, engine, prompts, reward))
            self.engines.append(engine)
        self.ready.set()
        await asyncio.gather(*(a.produce() for a in self.actors), self._follow())

    async def _follow(self) -> None:
        """Apply each version the learner publishes to the actors, 0.1 s later."""
        buf = self.actors[0].buffer
        while not all(a.state.stop for a in self.actors):
            v = await asyncio.to_thread(buf.learner_version)
            await asyncio.sleep(0.1)
            for a, engine in zip(self.actors, self.engines, strict=True):
                if v > a.state.version:
                    engine.version = a.state.version = v
                    a._version_changed.set()

    def clock(self) -> Counter:
        """Seconds per actor state, summed over the actors (``Actor.clock``)."""
        total: Counter = Counter()
        for a in self.actors:
            total.update(a.clock.totals())
        return total

    def set_speed(self, tokens_per_s: float) -> None:
        for engine in self.engines:
            engine.tokens_per_s = tokens_per_s

    def stop(self) -> None:
        for a in self.actors:
            a.state.stop = True
        self.join(30)
        assert not self.is_alive(), "actors did not stop"
        assert self.error is None, f"actor failed: {self.error!r}"


def write_cfg(name: str):
    from asyncrl.core.config.job import Config

    cfg = Config()
    cfg.buffer.name, cfg.buffer.capacity, cfg.buffer.max_staleness = name, CAPACITY, MAX_STALENESS
    cfg.buffer.lease_ttl_s = 10.0
    a = cfg.actor
    a.engine, a.num_actors, a.max_inflight = "sim", 2, 4
    cfg.sampling.n_samples, cfg.sampling.max_tokens = N_SAMPLES, 8
    cfg.learner.batch_groups = BATCH
    return cfg


def train(source, ledger, buf, steps: int, step_s: float, version: int) -> dict:
    """``steps`` learner steps from ``version``: next version, rates, time spent waiting."""
    t0, waited, committed0 = time.monotonic(), 0.0, buf.stats()["committed"]
    for _ in range(steps):
        ledger.version = version
        t = time.monotonic()
        batch = source.next_batch(version, BATCH)
        waited += time.monotonic() - t
        for e in batch:
            age = version - e.group.version_min
            assert age <= MAX_STALENESS, f"{e.group.group_id} trained {age} versions stale"
        time.sleep(step_s)  # the step
        ledger.ack([e.entry_id for e in batch], "trained")
        version += 1
        buf.set_learner_version(version)
    seconds = time.monotonic() - t0
    committed = buf.stats()["committed"] - committed0
    return {
        "version": version,
        "trained_per_s": steps * BATCH / seconds,
        "committed": committed,
        "committed_per_s": committed / seconds,
        "wait_frac": waited / seconds,
        "capacity_per_s": steps * BATCH / max(seconds - waited, 1e-3),  # when not waiting
    }


@pytest.mark.timeout(900 if FULL else 240)
def test_no_trained_group_exceeds_max_staleness_under_skew(
    redis_server, buffer_name, sim_model_dir
):
    from asyncrl.buffer.connection import connect
    from asyncrl.buffer.redis_buffer import BufferOptions, ReplayBuffer
    from asyncrl.learner.hub.data import GroupSource

    steps = fault_count(15, 100)
    cfg = write_cfg(buffer_name)

    def new_buffer():
        return ReplayBuffer(
            connect(redis_server.url, timeout_s=5.0),
            buffer_name,
            CAPACITY,
            options=BufferOptions(lease_ttl_s=10.0),
        )

    buf = new_buffer()
    buf.set_learner_version(0)
    ledger = Ledger(buf)
    source = GroupSource(ledger, "learner", None, MAX_STALENESS, timeout_s=60.0)
    producers = Producers(cfg, new_buffer, sim_model_dir)
    producers.start()
    assert producers.ready.wait(60) and producers.error is None, producers.error
    try:
        # phase 1: actors ~10x faster than the learner -> the queue ages, old groups are dropped
        c0 = producers.clock()
        p1 = train(source, ledger, buf, steps, SLOW_STEP_S, 0)
        c1 = producers.clock()
        stale_1 = len(ledger.stale)
        # phase 2: actors ~10x slower than the learner -> it waits for data
        producers.set_speed(SLOW_TOK_S)
        p2 = train(source, ledger, buf, steps, FAST_STEP_S, p1["version"])
    finally:
        producers.stop()
    spent = {k: c1[k] - c0[k] for k in c1}
    blocked_1 = spent["waiting_buffer"] / sum(spent.values())
    # the skew, measured: each side's rate while it is not held up by the other
    gen_s = spent.get("generating", 0.0) / cfg.actor.num_actors  # actors generate side by side
    skew_1 = p1["committed"] / max(gen_s, 1e-3) / p1["capacity_per_s"]
    skew_2 = p2["capacity_per_s"] / max(p2["committed_per_s"], 1e-3)
    assert skew_1 >= 10, f"phase 1: actors only {skew_1:.1f}x the learner's rate: {spent} {p1}"
    assert skew_2 >= 10, f"phase 2: learner only {skew_2:.1f}x the actors' rate: {p2}"
    assert blocked_1 > 0.8, f"phase 1: actors were not much faster than the learner: {spent}"
    assert p2["wait_frac"] > 0.8, f"phase 2: the learner was not waiting for actors: {p2}"
    assert stale_1 > 0, "phase 1 produced no stale group: the skew was not exercised"
    # every delivered group ended once: trained or dropped stale (the rest is still unread)
    assert all(c == 1 for c in ledger.acks.values()), "an entry was acked twice"
    assert set(ledger.acks) == set(ledger.delivered), "a delivered entry was never acked"
    ids = [gid for gid, _ in ledger.delivered.values()]
    assert len(ids) == len(set(ids)), "a group was delivered twice"
    for entry_id, version in ledger.stale:
        _, vmin = ledger.delivered[entry_id]
        assert version - vmin > MAX_STALENESS, f"{entry_id} dropped but was fresh"
    stats = buf.stats()
    assert source.dropped_stale == len(ledger.stale) == stats["dropped_stale"]
    assert stats["trained"] == len(ledger.trained) == 2 * steps * BATCH
    assert_conserved(stats)
    assert stats["leased"] == 0, "stopped actors kept leases"
    assert stats["committed"] == len(ledger.delivered) + stats["unread"] + stats["pending"]
    print(
        f"\n{2 * steps} steps, max_staleness {MAX_STALENESS}: phase 1 actors {skew_1:.0f}x "
        f"the learner's rate, phase 2 learner {skew_2:.0f}x the actors'; phase 1 learner "
        f"{p1['trained_per_s']:.1f} groups/s, actors blocked on the full buffer "
        f"{blocked_1:.0%} of the time, dropped stale {stale_1}; phase 2 actors "
        f"{p2['trained_per_s']:.1f} "
        f"groups/s, learner waiting {p2['wait_frac']:.0%} of the time, dropped stale "
        f"{len(ledger.stale) - stale_1}; stats {stats}"
    )
