"""The shipped batch script (examples/slurm/asyncrl.sbatch) under a real Slurm: ``slurmctld``
and four ``slurmd`` in network namespaces of their own (tests/slurm/cluster.py). Real
``sbatch``, ``srun``, ``scancel``, real Redis, real gloo across the learner's two nodes,
simulated engines (the scheduler path is what is under test).

The job: learner on n1 + n2, actors on n3 + n4, the buffer on n1, run files in one directory.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.multihost.cluster import check_conservation
from tests.slurm.cluster import KILL_WAIT_S, SlurmCluster

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.multihost]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "slurm" / "asyncrl.sbatch"
OVERRIDES = ["experiment=tiny", "actor.engine=sim", "actor.num_actors=2", "learner.nproc=1",
             "actor.sim_tokens_per_s=300"]  # fmt: skip
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


@pytest.fixture(scope="module")
def demo_model():
    """The demo model, built once here: four launches building it at once would take minutes."""
    from asyncrl.core.config.load import load_config
    from asyncrl.orchestration.launch.preflight import resolve_model

    return resolve_model(load_config(OVERRIDES))


@dataclass
class Job:
    id: int
    run: Path
    out: Path

    def text(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def tail(self, n: int = 6000) -> str:
        return self.text()[-n:]


def submit(slurm: SlurmCluster, tmp: Path, *overrides: str) -> Job:
    """``sbatch -N 4`` of the shipped script from the repository (where the demo model is
    cached), the run directory and the job's output in ``tmp``."""
    run, out = tmp / "run", tmp / "job.out"
    env = {"ASYNCRL_SLURM": "1",  # the test suite sets 0 (tests/conftest.py)
           "ASYNCRL_CMD": str(Path(sys.executable).parent / "asyncrl"),
           "ASYNCRL_RUN_DIR": str(run)}  # fmt: skip
    job_id = slurm.sbatch(["-N", "4", "-o", str(out), str(SCRIPT), *OVERRIDES, *overrides],
                          env=env, cwd=REPO)  # fmt: skip
    return Job(job_id, run, out)


def wait_line(slurm: SlurmCluster, job: Job, text: str, timeout_s: float) -> None:
    """Wait until the job's output holds ``text``; fail at once if the job ended first."""
    deadline = time.monotonic() + timeout_s
    while text not in job.text():
        state = slurm.state(job.id)
        assert state not in ENDED, f"job {job.id} {state} before {text!r}:\n{job.tail()}"
        assert time.monotonic() < deadline, f"no {text!r} after {timeout_s:.0f}s:\n{job.tail()}"
        time.sleep(0.5)


def wait_gone(slurm: SlurmCluster, job: Job, timeout_s: float) -> float:
    """Wait until Slurm lists the job no more as running or completing; the seconds it took."""
    t0 = time.monotonic()
    slurm.wait_for(lambda: slurm.state(job.id) in ENDED, f"job {job.id} to end", timeout_s)
    return time.monotonic() - t0


def summary(job: Job) -> dict:
    return json.loads((job.run / "learner0" / "summary.json").read_text())


def bind_of(run_dir: Path) -> str:
    return json.loads((run_dir / "config.json").read_text())["network"]["bind"]


def stray_processes(slurm: SlurmCluster) -> dict[str, list[str]]:
    """Per node, the processes other than Slurm's own daemons."""
    found = {}
    for node in slurm.nodes:
        cmds = []
        for pid in slurm.hosts.pids(node):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "slurmd" not in cmd and "slurmstepd" not in cmd and not cmd.startswith("unshare"):
                cmds.append(cmd.strip())
        if cmds:
            found[node] = cmds
    return found


@pytest.mark.timeout(900)
def test_a_job_whose_first_node_dies_is_requeued_resumes_and_trains_to_the_end(
    slurm, demo_model, tmp_path
):
    steps = 24
    job = submit(slurm, tmp_path, f"learner.steps={steps}", "learner.checkpoint_every=5")
    wait_line(slurm, job, "step   12 ", 300)  # past the checkpoint at version 10

    # n1 dies: the batch script, the buffer and learner node 0 with it. Slurm marks it DOWN
    # (SlurmdTimeout), stops the job's steps on the other nodes and requeues the job.
    slurm.kill_node("n1")
    slurm.wait_for(lambda: slurm.node_state("n1").startswith("down"), "n1 to be DOWN", 120)
    # n1's slurmd starts again only after the requeue. Started before it, it got the order to
    # end the first start's steps and SIGKILLed the job's steps KillWait later: once that hit
    # the second start's learner (the same job and step ids), begun meanwhile because
    # StartTime=now skips Slurm's BeginTime (~2 min after a requeue, which leaves room).
    slurm.wait_state(job.id, {"PENDING"}, 120)
    assert slurm.job(job.id)["Restarts"] == "1", slurm.job(job.id)
    slurm.restart_node("n1")
    slurm.wait_for(lambda: not slurm.node_state("n1").startswith("down"), "n1 back", 120)
    slurm.check(["scontrol", "update", f"JobId={job.id}", "StartTime=now"])

    state = slurm.wait_state(job.id, ENDED, 600)
    text = job.text()
    assert state == "COMPLETED", f"{state}:\n{job.tail()}"
    for start in (1, 2):
        assert (f"[slurm] job {job.id}, start {start}: learner on n1,n2, actors on n3,n4, "
                f"buffer on n1; run directory {job.run}") in text, job.tail()  # fmt: skip
    assert "[slurm] the learner exited with 0" in text, job.tail()

    # each role ran where the script put it, with its node's own address (taken from Slurm)
    addr = slurm.hosts.addr
    assert bind_of(job.run / "buffer") == addr("n1")
    assert [bind_of(job.run / f"learner{r}") for r in (0, 1)] == [addr("n1"), addr("n2")]
    assert [bind_of(job.run / f"actors{r}") for r in (0, 1)] == [addr("n3"), addr("n4")]

    # the second start resumed the same run: checkpoint, buffer (AOF), the same actor ids
    resumed = re.search(r"\[learner\] resumed from (\S+)/step_(\d+) at version (\d+)", text)
    assert resumed, job.tail()
    assert resumed.group(1) == str(job.run / "checkpoints") and int(resumed.group(3)) >= 10
    for r in (0, 1):  # a launch's ids are those of its run directory's token, both starts
        ids = {p.stem for p in (job.run / f"actors{r}").glob("actor[0-9]*.json")}
        assert ids in ({"actor0", "actor1"}, {"actor2", "actor3"}), (r, ids)
    result = summary(job)
    check_conservation(result)
    assert result["final_version"] == steps and result["groups_trained"] == steps * 4, result
    assert result["max_trained_staleness"] <= 1, result
    assert min(int(k) for k in result["trained_staleness_histogram"]) >= 0, result
    for i in range(4):
        done = re.search(rf"\[actor {i}\] done: .*duplicates (\d+).*final weights v(\d+)", text)
        assert done and done.groups() == ("0", str(steps)), (i, job.tail())
    assert not stray_processes(slurm), stray_processes(slurm)


@pytest.mark.timeout(600)
def test_scancel_stops_every_role_cleanly_after_a_last_checkpoint_and_the_summary(
    slurm, demo_model, tmp_path
):
    job = submit(slurm, tmp_path, "learner.steps=100000")
    wait_line(slurm, job, "step    8 ", 300)
    slurm.scancel(job.id)
    took = wait_gone(slurm, job, KILL_WAIT_S + 60)
    text = job.text()
    assert slurm.state(job.id) == "CANCELLED", job.tail()
    assert took < KILL_WAIT_S, f"the roles needed Slurm's SIGKILL ({took:.0f}s):\n{job.tail()}"
    # every role got SIGTERM at once; the buffer served on until the others let go
    assert "[slurm] SIGTERM (scancel" in text, job.tail()
    assert "[buffer] stop requested; serving until the learner" in text, job.tail()
    assert "still hold(s) it" not in text and "lost connection to Redis" not in text, job.tail()
    assert "already stopping" not in text and "Killed" not in text, job.tail()

    result = summary(job)
    check_conservation(result)
    final = result["final_version"]
    assert final >= 8, result
    sealed = job.run / "checkpoints" / f"step_{final:06d}" / "COMPLETE"
    assert sealed.is_file(), sorted((job.run / "checkpoints").iterdir())
    assert not stray_processes(slurm), stray_processes(slurm)
