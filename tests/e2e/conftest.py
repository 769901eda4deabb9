"""Shared pieces of the end-to-end tests: they run the real CLI as subprocesses."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def needs_full_stack():
    missing = [m for m in ("vllm",) if not _importable(m)]
    if shutil.which("redis-server") is None:
        missing.append("redis-server (apt-get install -y redis-server)")
    if missing:
        pytest.skip(f"end-to-end needs {', '.join(missing)}; `make test` installs them")


def _importable(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


def asyncrl_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "asyncrl.orchestration.cli", *args]


def run_cli(args: list[str], timeout: float, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        asyncrl_cmd(*args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
