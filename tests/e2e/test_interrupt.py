"""Ctrl-C on `asyncrl run` stops every role (learner ranks, actor + vLLM processes, Redis)."""

import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import needs_full_stack

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.redis]


def _processes_mentioning(text: str) -> list[str]:
    """Processes whose command line or environment contains ``text`` (vLLM's spawned engine
    and worker processes do not name the run dir in argv, but inherit ASYNCRL_REDIS_URL)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = (proc / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if text in cmd or text in env:
            found.append(f"{proc.name}: {cmd[:160]}")
    return found


def test_ctrl_c_stops_everything(tmp_path, roles):
    needs_full_stack()
    run_dir = tmp_path / "run"
    proc = roles.cli("run", "run", "experiment=tiny", "learner.steps=100000", f"run_dir={run_dir}")
    roles.wait_until(lambda: re.search(r"^step ", proc.output(), re.M), 600, "the first step")
    # roles hold their ACL user's URL (redis.actor.url, redis.learner.url), the launcher the admin's
    urls = [
        (run_dir / "redis" / f"redis{u}.url").read_text().strip()
        for u in ("", ".actor", ".learner")
    ]
    assert any(map(_processes_mentioning, urls)), (
        "the check below would be vacuous: no role has a URL"
    )
    t0 = time.monotonic()
    code = roles.signal(proc, signal.SIGINT, 240)
    assert code == 130, proc.tail()
    assert "interrupted" in proc.output()
    assert time.monotonic() - t0 < 180  # generous: CI machines are shared
    time.sleep(1.0)
    leftovers = _processes_mentioning(str(run_dir)) + [
        p for u in urls for p in _processes_mentioning(u)
    ]
    assert not leftovers, leftovers


def test_ctrl_c_while_the_vllm_engine_starts_stops_everything_within_seconds(tmp_path, roles):
    """Ctrl-C while the actor's vLLM engine is starting (and the learner waits for it): the
    launcher stops the actor first and kills what its death left behind (the engine core
    still starting) instead of waiting out the grace period; no traceback reaches the
    console (it once took 22 s)."""
    needs_full_stack()
    run_dir = tmp_path / "run"
    proc = roles.cli("run", "run", "experiment=tiny", "learner.steps=100000", f"run_dir={run_dir}")
    actor_log = run_dir / "actor0.log"
    roles.wait_until(  # the actor's own line (vLLM's INFO lines may be off: a fresh CI run
        # at c0c3255 had none, and waited 600 s for "EngineCore" while the job trained)
        lambda: (
            actor_log.is_file()
            and "starting the vLLM engine" in actor_log.read_text(errors="replace")
        ),
        600,
        "the actor's vLLM engine to start starting",
        poll_s=0.1,
    )
    assert "engine ready" not in proc.output(), "too late: the engine had started"
    t0 = time.monotonic()
    code = roles.signal(proc, signal.SIGINT, 120)
    took = time.monotonic() - t0
    out = proc.output()
    assert code == 130, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert took < 15, f"Ctrl-C during engine start took {took:.1f}s"
    time.sleep(1.0)
    assert not _processes_mentioning(str(run_dir)), _processes_mentioning(str(run_dir))
