"""``benchmarks/demo/startup.py --runs 1``: one timestamped ``asyncrl run`` of 3 steps; the
milestones are all there, in the order the roles reach them, and the JSON is complete. No
figure is asserted beyond its order (numbers come from the benchmark, not from tests)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.redis, pytest.mark.timeout(400)]


def test_one_run_reports_every_milestone_in_order(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks.demo.startup", "--runs", "1", "--out", str(tmp_path),
           "--name", "smoke"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=380)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads((tmp_path / "smoke.json").read_text())
    (run,) = doc["runs"]
    assert 0 < run["engine_start_s"] < run["engine_ready_s"] < run["first_step_s"], run
    assert run["learner_ready_s"] < run["first_step_s"], run
    assert doc["per_arm"]["this"]["first_step_s"]["n"] == 1
    for key in ("name", "created", "command", "commit", "machine", "config"):
        assert doc[key], key
    assert doc["command"].startswith("python -m benchmarks.demo.startup")
