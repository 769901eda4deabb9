"""Done-when 3: failures are reported as failures; restarts are opt-in and counted.

Real launchers (``asyncrl launch actors``, ``asyncrl run``) as subprocesses, real SIGKILLs:

- ``actor.restart_max=2``: a SIGKILLed actor is restarted (printed, counted in the launcher's
  ``asyncrl_launcher_role_restarts_total`` and in run.json), resumes its prompt cursor; the third
  death fails the job with the role, the signal and the used-up budget.
- ``asyncrl run`` whose learner rank is SIGKILLed exits non-zero naming the learner.
- ``asyncrl run`` with ``actor.restart_max=1`` (full runs only, see its skip reason): a
  SIGKILLed actor is restarted, rejoins weight sync (the learner rebuilds the group) and the
  run succeeds with the restart in summary.json.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from asyncrl.core.runtime.torchrun import free_port
from tests.faults.conftest import FULL
from tests.faults.test_actor_kills import Reader, assert_conserved, cursor
from tests.roles import Roles, cmdline

pytestmark = [pytest.mark.faults, pytest.mark.redis, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


class Launcher:
    """``python -m asyncrl.orchestration.cli ARGS`` started through ``roles`` (tests/roles.py), so every
    wait of the test fails at once, with the launcher's log, if the launcher dies."""

    def __init__(self, roles: Roles, *args: str, env: dict | None = None) -> None:
        self.roles = roles
        self.role = roles.cli("launcher", *args, env=env)

    @property
    def proc(self) -> subprocess.Popen:
        return self.role.popen

    @property
    def output(self) -> str:
        return self.role.output()

    def wait(self, timeout_s: float) -> int:
        """The launcher's exit code (its exit is expected now); bounded."""
        return self.roles.wait(self.role, timeout_s)

    def role_pids(self, needle: str) -> list[int]:
        """Descendants whose command line contains ``needle``."""
        import psutil

        out = []
        for p in psutil.Process(self.proc.pid).children(recursive=True):
            try:
                if needle in " ".join(p.cmdline()):
                    out.append(p.pid)
            except psutil.NoSuchProcess:
                pass
        return out

    def stop(self) -> None:
        """Ctrl-C, as a user would; SIGKILL the whole tree if that takes over a minute."""
        if self.proc.poll() is None:
            try:
                self.roles.signal(self.role, signal.SIGINT, 60)
            except subprocess.TimeoutExpired:
                self.roles.kill_tree(self.role)


def restarts_metric(client, name: str, role: str) -> float | None:
    """``asyncrl_launcher_role_restarts_total{role}`` scraped from the launcher's endpoint."""
    from asyncrl.core.config.network import NetworkConfig
    from asyncrl.core.net.endpoints import launcher_role, read_endpoints
    from asyncrl.orchestration.status import scrape

    launcher = read_endpoints(client, name).get(launcher_role("actors", NetworkConfig()))
    samples = scrape(launcher.metrics) if launcher else None
    return (
        None
        if samples is None
        else samples.get(("asyncrl_launcher_role_restarts_total", (("role", role),)))
    )


def sigkill_actor(launcher: Launcher, actor_id: int) -> int:
    """SIGKILL the actor process (python -m asyncrl.actors.main --actor-id I); returns its pid."""
    pids = launcher.role_pids(f"--actor-id {actor_id}")
    assert len(pids) == 1, f"expected one actor{actor_id} process, found {pids}"
    os.kill(pids[0], signal.SIGKILL)
    return pids[0]


@pytest.mark.timeout(240)
def test_dead_actor_is_restarted_counted_then_fails_the_job(
    redis_server, redis_client, buffer_name, sim_model_dir, announced_learner, tmp_path, roles
):
    from asyncrl.buffer.redis_buffer import BufferOptions, ReplayBuffer

    run_dir = tmp_path / "run"
    launcher = Launcher(
        roles, "launch", "actors", f"buffer.url={redis_server.url}", f"buffer.name={buffer_name}",
        f"model.path={sim_model_dir}", "actor.engine=sim", "actor.num_actors=2",
        "actor.restart_max=2", "sampling.n_samples=4", "actor.max_inflight=2",
        "actor.sim_tokens_per_s=150", "actor.sim_mean_len=4", "buffer.capacity=4",
        "buffer.lease_ttl_s=2", f"metrics_port={free_port()}", f"run_dir={run_dir}",
    )  # fmt: skip
    buf = ReplayBuffer(redis_client, buffer_name, 4, BufferOptions(lease_ttl_s=2.0))
    buf.set_learner_version(0)
    reader = Reader(buf, 4)
    reader.start()
    try:
        for n in (1, 2):
            start = cursor(redis_client, buffer_name, 0)
            roles.wait_until(
                lambda c=start: cursor(redis_client, buffer_name, 0) > c + 2,
                90,
                f"actor0 to produce (before kill {n})",
            )
            sigkill_actor(launcher, 0)
            roles.wait_until(
                lambda n=n: launcher.output.count("actor0 killed by SIGKILL; restarting it") == n,
                20,
                f"the launcher to announce restart {n}",
            )
            roles.wait_until(
                lambda n=n: restarts_metric(redis_client, buffer_name, "actor0") == n,
                20,
                f"asyncrl_launcher_role_restarts_total{{role=actor0}} == {n}",
            )
        # the restarted actor resumes its cursor: every index it claimed gets committed
        claimed = cursor(redis_client, buffer_name, 0)
        wanted = {2 * j for j in range(claimed)}
        roles.wait_until(lambda: wanted <= set(reader.indices), 90, "actor0's claimed prompts")
        assert restarts_metric(redis_client, buffer_name, "actor1") == 0
        sigkill_actor(launcher, 0)  # the third death: restart budget used up
        code = launcher.wait(60)
    finally:
        launcher.stop()
        reader.stop()
    out = launcher.output
    assert code != 0, out
    assert "FAILED: actor0 killed by SIGKILL after 2 restart(s) (actor.restart_max=2 used up)" in (
        out
    ), out
    info = json.loads((run_dir / "run.json").read_text())
    assert info["role_restarts"] == {"actor0": 2, "actor1": 0}
    assert procs_mentioning(str(run_dir)) == [], "actor processes outlived the launcher"
    assert not {g: c for g, c in reader.seen.items() if c > 1}, "a group was delivered twice"
    assert_conserved(buf.stats())


@pytest.mark.timeout(420)
def test_run_with_a_killed_learner_rank_exits_nonzero_naming_it(tmp_path, roles):
    from tests.e2e.conftest import needs_full_stack

    needs_full_stack()
    run_dir = tmp_path / "run"
    launcher = Launcher(
        roles, "run", "experiment=tiny", "learner.steps=1000", "learner.checkpoint_every=0",
        "learner.nproc=1", "actor.engine=sim", "actor.sim_tokens_per_s=500", "metrics_port=0",
        f"run_dir={run_dir}",
    )  # fmt: skip
    try:
        roles.wait_until(
            lambda: re.search(r"^step +2 \|", launcher.output, re.M),
            300,
            "the learner to train 2 steps",
            poll_s=1.0,
        )
        ranks = launcher.role_pids("asyncrl.learner.main")
        agents = (
            "torch.distributed.run",
            "asyncrl.core.runtime.torchrun",
        )  # torchrun itself, not a rank
        ranks = [p for p in ranks if not any(a in cmdline(p) for a in agents)]
        assert ranks, f"no learner rank process found: {launcher.output[-2000:]}"
        os.kill(ranks[0], signal.SIGKILL)
        code = launcher.wait(120)
    finally:
        launcher.stop()
    out = launcher.output
    assert code != 0, out
    assert "[asyncrl] FAILED: learner exited with code" in out, out[-3000:]
    assert procs_mentioning(str(run_dir)) == [], "role processes outlived `asyncrl run`"


def procs_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain ``text`` (e.g. a run directory)."""
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if text in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(cmd)
    return out


@pytest.mark.timeout(420)
def test_run_restarts_a_killed_actor_which_rejoins_weight_sync(tmp_path, roles):
    """A real ``asyncrl run`` (learner + 2 sim actors, ``actor.restart_max=1``): SIGKILL
    actor0 mid-run; the launcher restarts it, the learner rebuilds the weight group with it,
    and the run finishes successfully with the restart counted."""
    from tests.e2e.conftest import needs_full_stack

    needs_full_stack()
    # the survivor sits in the failed collective until the weight-sync deadline: a short one
    # keeps this in `make test` (the default 120 s is the same code path, only slower)
    run_dir, steps = tmp_path / "run", 40 if FULL else 20
    launcher = Launcher(
        roles, "run", "experiment=tiny", f"learner.steps={steps}", "learner.checkpoint_every=0",
        "learner.nproc=1", "actor.engine=sim", "actor.num_actors=2", "actor.restart_max=1",
        "actor.sim_tokens_per_s=500", "metrics_port=0", f"run_dir={run_dir}",
        "learner.weight_sync_timeout_s=15",
    )  # fmt: skip
    try:
        roles.wait_until(
            lambda: re.search(r"^step +5 \|", launcher.output, re.M),
            300,
            "the learner to train 5 steps",
            poll_s=1.0,
        )
        sigkill_actor(launcher, 0)
        code = launcher.wait(300)
    finally:
        launcher.stop()
    out = launcher.output
    assert code == 0, out[-4000:]
    assert "actor0 killed by SIGKILL; restarting it" in out, out[-4000:]
    restarts = json.loads((run_dir / "run.json").read_text())["role_restarts"]
    assert restarts == {"learner": 0, "actor0": 1, "actor1": 0}, restarts
    # the restarted actor rejoined: it received weights up to the end of the run
    final = json.loads((run_dir / "actor0.json").read_text())
    assert final["weight_syncs"] > 0 and final["version"] >= steps - 5, final
    assert final["committed"] + final["duplicates"] > 0, final
    # the learner formed a new group holding actor0 again: after a failed sync if the kill
    # caught one, or straight away if the restarted actor registered before the next sync
    learner_log = (run_dir / "learner.log").read_text()
    regroups = re.findall(r"weight sync: new group with actors \[([0-9, ]*)\]", learner_log)
    assert any("0" in m.split(", ") for m in regroups), learner_log[-3000:]
    sync = json.loads((run_dir / "summary.json").read_text())["weight_sync"]
    assert sync["regroups"] >= 1, (sync, regroups)
    print(f"\nactor0 after its restart: {final['weight_syncs']} weight syncs, final v"
          f"{final['version']}, {final['committed']} groups committed; learner: "
          f"{sync['failures']} failed syncs, new groups {regroups}")  # fmt: skip
    assert procs_mentioning(str(run_dir)) == [], "role processes outlived `asyncrl run`"
