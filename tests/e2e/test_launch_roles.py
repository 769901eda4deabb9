"""`asyncrl launch buffer|learner|actors` as three separate commands against one Redis URL."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, asyncrl_cmd, needs_full_stack, read_summary

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.redis]


def _wait_for_file(path: Path, proc: subprocess.Popen, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.is_file() and path.read_text().strip():
            return path.read_text().strip()
        assert proc.poll() is None, (
            f"buffer exited early: {proc.stdout.read() if proc.stdout else ''}"
        )
        time.sleep(0.2)
    raise AssertionError(f"{path} did not appear in {timeout_s}s")


def test_three_roles_train_together(tmp_path):
    needs_full_stack()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    buffer = subprocess.Popen(
        asyncrl_cmd("launch", "buffer", f"run_dir={tmp_path / 'buffer'}"),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = _wait_for_file(tmp_path / "buffer" / "redis" / "redis.url", buffer, 300)
        common = ["experiment=tiny", f"buffer.url={url}", "buffer.name=launchtest"]
        actors = subprocess.Popen(
            asyncrl_cmd("launch", "actors", *common, f"run_dir={tmp_path / 'actors'}"),
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        learner = subprocess.run(
            asyncrl_cmd("launch", "learner", *common, f"run_dir={tmp_path / 'learner'}"),
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert learner.returncode == 0, learner.stdout[-4000:] + learner.stderr[-4000:]
        out, _ = actors.communicate(timeout=120)
        assert actors.returncode == 0, out[-4000:]
        summary = read_summary(tmp_path / "learner")
        assert summary["final_version"] == 4
        assert summary["groups_trained"] == 16
        assert "committed" in out  # the actor's closing line
    finally:
        buffer.send_signal(signal.SIGINT)
        buffer.wait(30)
    assert buffer.returncode == 0
