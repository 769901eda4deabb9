"""``benchmarks/parts/overheads.py own`` at a tiny size: ``Actor.produce`` over an instant
``SimEngine`` into a real redis-server commits every group, and the JSON carries each round's
CPU split and the medians per group. No figure is asserted beyond being measured (numbers come
from the benchmark, not from tests)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.timeout(400)]


def test_own_part_measures_every_round_and_writes_the_medians(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks.parts.overheads", "own", "--prompts", "40",
           "--rounds", "2", "--out", str(tmp_path), "--name", "smoke"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=380)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads((tmp_path / "smoke_own.json").read_text())
    own = doc["results"]["own"]
    assert own["groups"] == 40 and len(own["runs"]) == 2
    for run in own["runs"]:
        assert run["groups"] >= 40 and run["completion_tokens"] > 0, run
        assert run["client_cpu_s"] > 0 and run["seconds"] > 0, run
        assert any(k.startswith("redis") for k in run["children_cpu_s_by_name"]), run
    med = own["ms_per_group_median"]
    assert set(med) == {"wall", "client_cpu", "redis_cpu"} and med["wall"] > 0, med
    assert doc["command"].startswith("python -m benchmarks.parts.overheads own")
    assert doc["config"]["out"] is None
    assert "own work (medians, ms a group)" in proc.stdout
