"""Scrape the endpoints of a real ``asyncrl run`` (tiny model, cores pinned by the default
``cpu_affinity: auto``) mid-run, check every documented name, ``asyncrl status`` and the core
pinning, then stop it with Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from asyncrl.core.config.checks import format_indices
from asyncrl.core.runtime.torchrun import free_port
from asyncrl.orchestration.status import scrape
from tests.e2e.conftest import needs_full_stack, run_cli
from tests.integration.test_metrics_endpoints import TALLIED, missing_names
from tests.roles import Roles, cmdline

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.redis]

USABLE = sorted(os.sched_getaffinity(0))
PINNED = (
    len(USABLE) >= 2
)  # cpu_affinity=auto (the default): learner on the lowest core, actor on the rest


def _endpoints(run_dir: Path) -> dict[str, str]:
    """role -> ``host:port`` of its /metrics."""
    from asyncrl.buffer.connection import connect
    from asyncrl.core.net.endpoints import read_endpoints

    url_file = run_dir / "redis" / "redis.url"
    if not url_file.is_file():
        return {}
    client = connect(url_file.read_text().strip())
    try:
        endpoints = read_endpoints(client, "asyncrl")
    finally:
        client.close()
    return {role: e.metrics for role, e in endpoints.items()}


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


@pytest.fixture(scope="module")
def live_run(tmp_path_factory):
    needs_full_stack()
    run_dir = tmp_path_factory.mktemp("metrics_run")
    base = free_port()
    args = ["run", "experiment=tiny", "learner.steps=1000", "learner.checkpoint_every=0",
            f"metrics_port={base}", f"run_dir={run_dir}"]  # fmt: skip
    # the defaults: learner.nproc=1, learner.cpu_affinity=auto, actor.cpu_affinity=auto

    def ready() -> dict | None:
        eps = _endpoints(run_dir)
        learner = scrape(eps["learner"]) if "learner" in eps else None
        version = learner.get(("asyncrl_learner_version", ()), 0) if learner else 0
        return eps if version >= 3 and len(eps) >= 3 else None

    with Roles(tmp_path_factory.mktemp("metrics_run_logs"), grace_s=120) as roles:
        run = roles.cli("run", *args)
        eps = roles.wait_until(ready, 600, "version 3 with 3 metrics endpoints", poll_s=2)
        yield run.popen, run_dir, eps


def test_every_process_serves_its_documented_metrics_on_loopback(live_run):
    _, _, eps = live_run
    assert set(eps) == {"launcher", "learner", "actor0"}
    for role, addr in eps.items():
        assert addr.startswith("127.0.0.1:"), (role, addr)
        samples = scrape(addr)
        assert samples is not None, role
        # no episodes in experiment=tiny: their counters are not exported
        assert missing_names(samples, role.rstrip("0123456789"), TALLIED) == [], role
    learner = scrape(eps["learner"])
    assert learner[("asyncrl_learner_steps_total", ())] >= 3
    assert learner[("asyncrl_learner_weight_sync_bytes_total", ())] > 0
    actor = scrape(eps["actor0"])
    assert actor[("asyncrl_actor_tokens_generated_total", ())] > 0
    busy = actor[("asyncrl_actor_time_seconds_total", (("state", "generating"),))]
    assert busy > 0


def test_status_prints_one_screen_about_the_job(live_run):
    _, run_dir, _ = live_run
    proc = run_cli(["status", f"run_dir={run_dir}"], timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for word in ("buffer", "learner", "actor0", "launcher", "steps/s", "tok/s", "waiting_data"):
        assert word in out, out
    assert len(out.splitlines()) <= 25


@pytest.mark.skipif(not PINNED, reason="core pinning needs 2+ cores")
def test_roles_run_on_their_configured_cores(live_run):
    proc, run_dir, _ = live_run
    pids = _descendants(proc.pid)
    learners = [p for p in pids if "asyncrl.learner.main" in cmdline(p)]
    actors = [p for p in pids if "asyncrl.actors.main" in cmdline(p)]
    assert learners and actors
    learner_cores, actor_cores = set(USABLE[:1]), set(USABLE[1:])
    for p in learners:
        assert _affinity(p) in (learner_cores, None)
    for p in pids:  # the actor and every process below it (vLLM engine core, worker)
        if p in actors or any(a in _ancestors(p) for a in actors):
            assert _affinity(p) in (actor_cores, None), cmdline(p)
    # the roles read the resolved lists, never "auto" (and vLLM binds inside the actor's)
    cfg = json.loads((run_dir / "config.json").read_text())
    fmt = lambda cores: format_indices(sorted(cores))  # noqa: E731
    assert cfg["learner"]["cpu_affinity"] == fmt(learner_cores)
    assert cfg["actor"]["cpu_affinity"] == cfg["actor"]["cpu_bind"] == fmt(actor_cores)


def _affinity(pid: int) -> set[int] | None:
    """The CPUs ``pid`` may run on; None if it exited since it was listed (a short-lived
    helper below vLLM or torchrun)."""
    try:
        return os.sched_getaffinity(pid)
    except ProcessLookupError:
        return None


def _ancestors(pid: int) -> list[int]:
    out = []
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
        out.append(pid)
    return out


def test_ctrl_c_stops_the_run(live_run):
    proc, _, _ = live_run
    proc.send_signal(signal.SIGINT)
    assert proc.wait(120) == 130
