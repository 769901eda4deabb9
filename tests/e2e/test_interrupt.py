"""Ctrl-C on `asyncrl run` stops every role (learner ranks, actor + vLLM processes, Redis)."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, asyncrl_cmd, needs_full_stack

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


def test_ctrl_c_stops_everything(tmp_path):
    needs_full_stack()
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        asyncrl_cmd("run", "experiment=tiny", "learner.steps=100000", f"run_dir={run_dir}"),
        cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines = []
    deadline = time.monotonic() + 600
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("step ") or time.monotonic() > deadline:
            break
    assert any(x.startswith("step ") for x in lines), "".join(lines[-40:])
    # roles hold their ACL user's URL (redis.actor.url, redis.learner.url), the launcher the admin's
    urls = [
        (run_dir / "redis" / f"redis{u}.url").read_text().strip()
        for u in ("", ".actor", ".learner")
    ]
    assert any(map(_processes_mentioning, urls)), (
        "the check below would be vacuous: no role has a URL"
    )
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=240)
    assert proc.returncode == 130, rest[-3000:]
    assert "interrupted" in rest
    assert time.monotonic() - t0 < 180  # generous: CI machines are shared
    time.sleep(1.0)
    leftovers = _processes_mentioning(str(run_dir)) + [
        p for u in urls for p in _processes_mentioning(u)
    ]
    assert not leftovers, leftovers
