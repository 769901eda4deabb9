"""Guarantee 2: the learner SIGKILLed at random points (in a step, between a checkpoint and
the ack of its groups, while a checkpoint is being sealed) resumes from the newest complete
checkpoint, acks every group exactly once, and replays the same batches as an uninterrupted
run with the same seed.

Real parts: a real redis-server (the session's), a real learner process (``asyncrl.learner.main``:
FSDP2 over gloo, the ``Hub``, ``asyncrl.learner.state.checkpoint``), real SIGKILLs. No actors: the buffer is
pre-filled with valid groups (``asyncrl.buffer.testing.random_group``) in a fixed order and the
learner runs with ``learner.weight_sync=false``, so arrival order is fixed and the batches of
an uninterrupted run are a reference. Each step's group ids are recorded with the test-only
failpoint trace ``learner.after_read=trace:FILE@0``.

Semantics checked (docs/reliability.md): training is at-least-once, acking is exactly-once.
Groups of steps after the last complete checkpoint are re-read from the pending list and
trained again after a restart (their effect on the weights was lost with the process); a
group is acked ``trained`` once, by the checkpoint that contains its step.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.faults.conftest import FULL, fault_count

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.redis]

ROOT = Path(__file__).resolve().parents[2]
N_SAMPLES, BATCH_GROUPS, CKPT_EVERY = 4, 2, 2
NPROC = 2 if FULL else 1  # learner ranks
RUN_DEADLINE_S = 240.0  # one learner run on a loaded 2-core machine (imports: 10-30 s)
# where a failpoint kill lands: (failpoint, hits to let pass before the kill is armed: 1..n)
KILL_POINTS = (
    ("learner.before_ack", 2),  # checkpoint durable, its groups not acked yet
    ("random", 0),  # an external SIGKILL at a random moment after the first step
    ("checkpoint.before_rename", 2),  # checkpoint written and marked, not yet renamed
    ("learner.after_read", 5),  # a batch read (pending), its step not run
    ("learner.after_step", 5),  # a step done, not checkpointed
    ("checkpoint.after_dcp", 2),  # in the middle of a checkpoint write
)
# every killed run completes its first step after resume (kill hits >= 2 for after_read):
# a batch that crashed the learner twice is a poison suspect and is batched apart
# (learner/hub/data.py), which is the one case where the replayed batches differ by design


def prefill(url: str, name: str, count: int, seed: int) -> dict[str, str]:
    """Commit ``count`` valid groups in a fixed order; returns {entry id: group id}."""
    from asyncrl.buffer.connection import connect
    from asyncrl.buffer.redis_buffer import ReplayBuffer
    from asyncrl.buffer.testing import random_group

    rng = random.Random(seed)
    client = connect(url, timeout_s=5.0)
    buf = ReplayBuffer(client, name, capacity=count)
    for i in range(count):
        group = random_group(rng, f"g{i:04d}", n=N_SAMPLES, vocab_size=32, versions=(0, 0),
                             max_len=6)  # fmt: skip
        lease = buf.lease(0, 5.0)
        assert lease is not None and buf.commit(lease, group)
    rows = client.xrange(name)
    client.close()
    return {eid.decode(): f[b"group_id"].decode() for eid, f in rows}


def write_config(run_dir: Path, name: str, steps: int, capacity: int) -> None:
    from asyncrl.core.config.job import Config
    from asyncrl.core.config.load import config_to_json

    cfg = Config()
    cfg.run_dir, cfg.metrics_port, cfg.seed = str(run_dir), 0, 0
    cfg.buffer.name, cfg.buffer.capacity, cfg.buffer.max_staleness = name, capacity, 10_000
    cfg.sampling.n_samples, cfg.sampling.max_tokens = N_SAMPLES, 6
    lc = cfg.learner
    lc.nproc, lc.steps, lc.batch_groups, lc.checkpoint_every = (
        NPROC,
        steps,
        BATCH_GROUPS,
        CKPT_EVERY,
    )
    lc.weight_sync, lc.data_timeout_s, lc.warmup_steps = False, 60.0, 1
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(config_to_json(cfg))


class Learner:
    """One learner run: ``python -m asyncrl.learner.main`` (1 rank) or torchrun (full run, 2 ranks,
    as asyncrl/orchestration/launch/roles.py builds its command)."""

    def __init__(self, run_dir: Path, model: str, url: str, failpoints: str, log: Path):
        from asyncrl.core.runtime.torchrun import free_port as _free_port

        if FULL:  # the production launch path, as asyncrl/orchestration/launch/roles.py builds it
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={NPROC}",
                   f"--master_port={_free_port()}", "--master_addr=127.0.0.1"]  # fmt: skip
        else:  # one rank without torchrun's own import (halves the start-up on 2 cores)
            cmd = [sys.executable]
        cmd += ["-m", "asyncrl.learner.main", "--run-dir", str(run_dir), "--model-dir", model]
        env = {**os.environ, "ASYNCRL_REDIS_URL": url, "ASYNCRL_FAILPOINTS": failpoints,
               "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}  # fmt: skip
        self.log = log
        self._out = open(log, "w")  # noqa: SIM115 (closed in wait)
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._out,
                                     stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip

    def wait(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill_all()
            self.proc.wait()
            raise AssertionError(f"learner ran past {timeout_s}s:\n{self.tail()}") from None
        finally:
            self._out.close()

    def kill_all(self) -> None:
        """SIGKILL the learner and every rank (torchrun ranks have their own sessions)."""
        import psutil

        try:
            procs = [psutil.Process(self.proc.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for p in procs:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass

    def tail(self) -> str:
        """The log's last 40 lines, after every line that names an error (any rank)."""
        lines = self.log.read_text(errors="replace").splitlines(True)
        errors = [x for x in lines[:-40] if "Error" in x or "error" in x]
        return "".join(errors[-20:] + ["...\n"] + lines[-40:])


def read_trace(path: Path) -> list[dict]:
    """Rank 0's traced steps (other ranks trace ``groups: null``)."""
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a SIGKILL in the middle of its write
            continue
    return [r for r in rows if r.get("groups") is not None]


def checkpoints_trained_ids(run_dir: Path) -> list[list[str]]:
    """The ``trained_ids`` of every complete checkpoint, oldest first."""
    from asyncrl.learner.state.checkpoint import complete_version

    done = sorted((v, p) for p in (run_dir / "checkpoints").glob("step_*")
                  if (v := complete_version(p)) is not None)  # fmt: skip
    return [json.loads((p / "state.json").read_text())["trained_ids"] for _, p in done]


def run_reference(tmp_path: Path, url: str, model: str, groups: int, steps: int) -> dict:
    """An uninterrupted run on an identical pre-filled buffer: {version: batch group ids}."""
    name = f"ref-{uuid.uuid4().hex[:8]}"
    prefill(url, name, groups, seed=5)
    run_dir = tmp_path / "reference"
    write_config(run_dir, name, steps, groups)
    trace = tmp_path / "reference.trace"
    learner = Learner(run_dir, model, url, f"learner.after_read=trace:{trace}@0",
                      tmp_path / "reference.log")  # fmt: skip
    assert learner.wait(RUN_DEADLINE_S) == 0, learner.tail()
    batches = {t["version"]: t["groups"] for t in read_trace(trace)}
    assert sorted(batches) == list(range(steps)), sorted(batches)
    return batches


def kill_run(learner: Learner, point: str, trace: Path, before: int, rng: random.Random) -> None:
    """Bound one killed run: wait for the failpoint's SIGKILL, or send one at random after
    the run's first step (its second batch was read)."""
    if point == "random":
        deadline = time.monotonic() + RUN_DEADLINE_S
        while len(read_trace(trace)) < before + 2 and learner.proc.poll() is None:
            assert time.monotonic() < deadline, learner.tail()
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.5))
        learner.kill_all()
    rc = learner.wait(RUN_DEADLINE_S)
    # the rank itself got SIGKILL (-9); under torchrun, its failure report names the rank's
    # exit code ("exitcode  : -9 (pid: ...)") and torchrun exits 1
    log = learner.log.read_text(errors="replace")
    killed = rc == -signal.SIGKILL or (rc == 1 and re.search(r"exitcode\s*:\s*-9\b", log))
    assert killed, f"learner exited {rc}, not by SIGKILL ({point}):\n{learner.tail()}"


@pytest.mark.timeout(3600 if FULL else 420)
def test_learner_sigkilled_resumes_acks_once_and_replays_the_same_batches(
    redis_server, tiny_model, tmp_path
):
    from asyncrl.buffer.connection import connect
    from asyncrl.buffer.redis_buffer import ReplayBuffer
    from asyncrl.learner.state.checkpoint import complete_version, latest_checkpoint

    restarts = fault_count(4, 20)
    steps = fault_count(14, 120)
    groups = steps * BATCH_GROUPS + 4  # 4 spare groups: still buffered at the end
    reference = run_reference(tmp_path, redis_server.url, tiny_model, groups, steps)

    name = f"kill-{uuid.uuid4().hex[:8]}"
    entry_to_group = prefill(redis_server.url, name, groups, seed=5)
    run_dir = tmp_path / "run"
    write_config(run_dir, name, steps, groups)
    trace = tmp_path / "run.trace"
    rng = random.Random(2)
    resumed_at, replayed_same, retrained = [], 0, 0
    for i in range(restarts + 1):
        latest = latest_checkpoint(run_dir)
        expect_v = complete_version(latest) if latest else 0
        point, hits = KILL_POINTS[i % len(KILL_POINTS)]
        fps = f"learner.after_read=trace:{trace}@0"
        if i < restarts and point != "random":
            fps += f",{point}=kill@{kill_hit(point, hits, steps - expect_v, rng)}"
        before = len(read_trace(trace))
        learner = Learner(run_dir, tiny_model, redis_server.url, fps, tmp_path / f"l{i}.log")
        if i < restarts:
            kill_run(learner, point, trace, before, rng)
        else:
            assert learner.wait(RUN_DEADLINE_S) == 0, learner.tail()
        run_steps = read_trace(trace)[before:]
        text = learner.log.read_text(errors="replace")
        if expect_v:  # resumed from the newest complete checkpoint
            assert f"at version {expect_v}" in text, f"expected resume at {expect_v}:\n{text}"
            resumed_at.append(expect_v)
        assert run_steps, f"run {i} trained no step:\n{learner.tail()}"
        if run_steps:  # same seed, same data order: the first batch is the reference's
            first = run_steps[0]
            assert first["version"] == expect_v, (first, expect_v)
            assert first["groups"] == reference[expect_v], (
                f"run {i}: batch at version {expect_v} after resume {first['groups']} != "
                f"uninterrupted {reference[expect_v]}"
            )
            replayed_same += 1
        retrained += sum(1 for t in run_steps if t["version"] < max_version_seen(trace, before))

    final = json.loads((run_dir / "summary.json").read_text())
    assert final["final_version"] == steps

    # exactly-once acking: the checkpoints' trained ids are disjoint and are all that was acked
    buf = ReplayBuffer(connect(redis_server.url, timeout_s=5.0), name, capacity=groups)
    stats = buf.stats()
    per_ckpt = checkpoints_trained_ids(run_dir)
    flat = [e for ids in per_ckpt for e in ids]
    assert len(flat) == len(set(flat)), "a group was acked as trained by two checkpoints"
    assert stats["trained"] == len(flat)
    dead = {eid for eid, _ in buf.dead_letters(1000)}
    still = set(entry_to_group) - set(flat) - dead
    assert stats["unread"] + stats["pending"] == len(still)
    # conservation, and every committed group in exactly one terminal (or buffered) state
    dropped = sum(v for k, v in stats.items() if k.startswith("dropped_"))
    assert stats["committed"] == groups
    assert stats["committed"] == stats["trained"] + dropped + stats["unread"] + stats["pending"]
    trained_groups = [entry_to_group[e] for e in flat]
    assert len(trained_groups) + len(dead) + len(still) == groups
    # the last run trained what the uninterrupted run trained, step by step
    assert sorted(trained_groups) == sorted(g for v in range(steps) for g in reference[v])
    print(
        f"\nlearner kills: {restarts} restarts, resumed at {resumed_at}; first batch after "
        f"resume == uninterrupted: {replayed_same}; steps re-trained after a restart: "
        f"{retrained}; stats {stats}"
    )


def kill_hit(point: str, hits: int, remaining: int, rng: random.Random) -> int:
    """Which hit of ``point`` kills: at most ``hits``, and early enough that the run is
    killed before it finishes its ``remaining`` steps."""
    if point.startswith("checkpoint.") or point == "learner.before_ack":
        most = max(1, (remaining - 1) // CKPT_EVERY)  # checkpoints before the last step
        return rng.randint(1, min(hits, most))
    low = 2 if point == "learner.after_read" else 1
    return rng.randint(low, max(low, min(hits, remaining - 1)))


def max_version_seen(trace: Path, before: int) -> int:
    """The highest step version traced before a run started (steps below it are re-runs)."""
    return max((t["version"] + 1 for t in read_trace(trace)[:before]), default=0)
