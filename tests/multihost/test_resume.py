"""A learner that spans two hosts (torchrun, 2 nodes x 1 rank, checkpoints in one shared
``learner.checkpoint_dir``) is stopped on both hosts and launched again with the same
commands: first by Ctrl-C (SIGTERM to both launchers), then by the death of both hosts
(SIGKILL of every process on them). Each time it resumes on both nodes from the newest
complete checkpoint and the run finishes with every group acked ``trained`` once. Real
``asyncrl launch`` commands, real Redis, real gloo, simulated engines."""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

from tests.multihost.cluster import Cluster, check_conservation

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.multihost]

STEPS, EVERY = 30, 5
STOP_AFTER = 6  # Ctrl-C after this step (0-based, as the step lines count)
KILL_AFTER = 3 * EVERY + 1  # the checkpoint of version 15 is sealed, that of 20 is far off
LEARNER = [f"learner.steps={STEPS}", f"learner.checkpoint_every={EVERY}",
           "learner.weight_sync_timeout_s=10", "buffer.lease_ttl_s=5"]  # fmt: skip
ACTORS = ["actor.sim_tokens_per_s=300", *LEARNER[2:]]
# what a step's record says about its batch and the weights it met: bit-identical when the
# same batch meets the same weights (both nodes' halves) and optimizer state
MODEL_METRICS = ("tokens", "reward", "entropy", "approx_kl_behave", "loss", "grad_norm")


@pytest.mark.timeout(600)
def test_learner_on_two_hosts_resumes_after_ctrl_c_and_after_both_hosts_die(cluster):
    roles, shared = cluster.roles, cluster.tmp / "shared-checkpoints"
    cluster.start_buffer()
    learners = cluster.start_learner(*LEARNER)
    actors = cluster.start_actors(*ACTORS)

    # 1. Ctrl-C on both learner hosts, then the same commands again: it resumes where it
    # stopped, and trains nothing twice
    roles.wait_line(learners[0], f"step {STOP_AFTER:4d} ", 300)
    stopped = _ctrl_c_both(cluster, learners, actors)
    mark = len(learners[0].output())
    learners, actors = cluster.start_learner(*LEARNER), cluster.start_actors(*ACTORS)
    _wait_since(roles, learners[0], mark, f"^step {KILL_AFTER:4d} ")
    _check_resumed(learners[0].output()[mark:], shared, stopped)

    # 2. Every process of both learner hosts SIGKILLed (a power loss, a preemption) two steps
    # after a periodic checkpoint: the same commands resume there and train the lost steps
    # again (at-least-once training); the actors, left running, follow the new learner
    t_kill = time.monotonic()
    trained, resume_at, killed_records = _kill_both(cluster, learners, mark)
    marks = [len(p.output()) for p in (*learners, actors)]
    learners = cluster.start_learner(*LEARNER)
    cluster.wait_job(learners, actors, 300)
    wall_s = time.monotonic() - t_kill
    out0, out1, actor_log = (
        p.output()[m:] for p, m in zip((*learners, actors), marks, strict=True)
    )
    _check_resumed(out0, shared, resume_at)
    reread = re.search(r"re-read (\d+) groups delivered before a restart", out0)
    assert reread and int(reread.group(1)) >= 4 * (trained - resume_at), out0[-3000:]
    assert "learner node 1 done" in out1, out1[-3000:]
    addr = re.search(r"control plane on (tcp://\S+)", out0).group(1)
    assert f"the learner's control plane moved to {addr}" in actor_log, actor_log[-3000:]

    # node 1 loaded its shards of the same checkpoint: the steps trained again met the same
    # batches and weights as before the kill, and every checkpoint since holds both nodes'
    # shards of one version
    again = {r["step"]: r for r in _records(cluster)[len(killed_records) :]}
    before = {r["step"]: r for r in killed_records}
    for step in range(resume_at, trained):
        assert _model(again[step]) == _model(before[step]), step
    after = {v: p for v, p in _checkpoints(shared).items() if v > resume_at}
    assert sorted(after) == list(range(resume_at + EVERY, STEPS + 1, EVERY)), sorted(after)
    assert all(_shards(p) == 2 for p in after.values()), {v: _shards(p) for v, p in after.items()}

    summary = cluster.summary()
    check_conservation(summary)  # every group acked once, the replayed steps' too
    assert summary["final_version"] == STEPS and summary["groups_trained"] == STEPS * 4, summary
    assert summary["trained_totals"]["groups"] == STEPS * 4, summary["trained_totals"]
    stats = cluster.actor_stats()
    assert sorted(stats) == [0, 1], stats
    for i, s in stats.items():
        assert s["version"] == STEPS and s["duplicates"] == 0, (i, s)
    print(f"\nCtrl-C after version {stopped}, resumed there; SIGKILL after version {trained}, "
          f"resumed at {resume_at} ({trained - resume_at} step(s) trained again, "
          f"{reread.group(1)} groups re-read); kill to the end {wall_s:.0f} s; groups "
          f"committed {summary['groups_committed']}, trained {summary['groups_trained']}, "
          f"still buffered {summary['groups_still_buffered']}")  # fmt: skip


def _ctrl_c_both(cluster: Cluster, learners: list, actors) -> int:
    """SIGTERM both learner launchers (a user's Ctrl-C on each host): the ranks stop together
    after a final checkpoint of both nodes' shards, and the learner stops the actors, as at
    the end of a run. Returns the version it stopped at."""
    roles, shared = cluster.roles, cluster.tmp / "shared-checkpoints"
    roles.expect_exit(actors)
    for proc in learners:
        roles.release(proc)
        proc.popen.send_signal(signal.SIGTERM)
    assert [p.popen.wait(60) for p in learners] == [130, 130], learners[0].tail(60)
    assert roles.wait(actors, 60) == 0, actors.tail(60)
    stopped = max(_steps(learners[0].output())) + 1
    newest = _checkpoints(shared)
    assert max(newest) == stopped and _shards(newest[stopped]) == 2, (stopped, newest)
    return stopped


def _kill_both(cluster: Cluster, learners: list, mark: int) -> tuple[int, int, list[dict]]:
    """SIGKILL every process on both learner hosts; returns the version the learner had
    reached (from node 0's log after ``mark``), the newest complete checkpoint's version and
    the step records written so far."""
    for proc in learners:
        cluster.roles.release(proc)
    for host in ("learner0", "learner1"):
        cluster.hosts.kill_all(host)
    trained = max(_steps(learners[0].output()[mark:])) + 1
    resume_at = max(_checkpoints(cluster.tmp / "shared-checkpoints"))
    assert 3 * EVERY <= resume_at < trained, (resume_at, trained)
    return trained, resume_at, _records(cluster)


def _check_resumed(out: str, shared, version: int) -> None:
    """Node 0 said it resumed from checkpoint ``version``, and trained on from there."""
    ckpt = shared / "checkpoints" / f"step_{version:06d}"
    assert f"resumed from {ckpt} at version {version}" in out, out[-3000:]
    assert _steps(out)[:1] == [version], out[-3000:]


def _checkpoints(root) -> dict:
    """{version: directory} of the complete checkpoints under ``root``."""
    from asyncrl.learner.state.checkpoint import complete_version

    found = ((complete_version(p), p) for p in (root / "checkpoints").glob("step_*"))
    return {v: p for v, p in found if v is not None}


def _shards(path) -> int:
    return len(list((path / "dcp").glob("__*_*.distcp")))


def _steps(log: str) -> list[int]:
    """The numbers of the learner's step lines (step V trains version V into V + 1)."""
    return [int(n) for n in re.findall(r"^step +(\d+) ", log, re.M)]


def _wait_since(roles, proc, mark: int, pattern: str, timeout_s: float = 300) -> None:
    """Wait for ``pattern`` in what ``proc`` wrote after offset ``mark`` of its log."""
    rx = re.compile(pattern, re.M)
    roles.wait_until(lambda: rx.search(proc.output()[mark:]), timeout_s, repr(pattern))


def _records(cluster: Cluster) -> list[dict]:
    """Node 0's step records (metrics.jsonl), in the order they were written; a line torn by
    the SIGKILL is skipped (as the learner itself does)."""
    out = []
    for line in (cluster.tmp / "learner0" / "metrics.jsonl").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _model(record: dict) -> dict:
    return {k: record.get(k) for k in MODEL_METRICS}
