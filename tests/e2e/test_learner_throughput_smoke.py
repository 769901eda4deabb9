"""``benchmarks/learner_throughput.py --preset tiny``: the JSON is complete.

A schema check on the tiny preset end to end (random model saved and loaded, every arm in its
worker processes, the fit search), not a measurement: no figure is asserted beyond being
present and well-formed. ~50 s on 2 shared cores (ten short worker processes).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ARMS = ["padded", "asyncrl", "bare", "extra"]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("throughput")
    cmd = [sys.executable, "-m", "benchmarks.learner_throughput", "--preset", "tiny",
           "--rounds", "1", "--repeat", "1", "--out", str(out), "--name", "smoke",
           "--arm", "extra:model.logprob_chunk_tokens=16"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads((out / "smoke.json").read_text()), proc.stdout


def test_provenance(result):
    doc, _ = result
    for key in ("name", "created", "command", "commit", "machine", "config", "versions"):
        assert doc[key], key
    assert doc["command"].startswith("python -m benchmarks.learner_throughput --preset tiny")
    assert doc["machine"]["cpu"] and doc["machine"]["torch"]
    cfg = doc["config"]
    assert cfg["preset"] == "tiny" and cfg["device"] == "cpu" and cfg["n_params"] > 0
    assert cfg["threads"]["worker"]["torch_threads"] >= 1
    assert doc["batch"]["real_tokens"] > 0
    assert "gpu" in doc  # null on CPU


def test_every_arm_has_every_figure(result):
    doc, stdout = result
    assert list(doc["arms"]) == ARMS
    assert "model.logprob_chunk_tokens=16" in doc["arms"]["extra"]["overrides"]
    for name, arm in doc["arms"].items():
        assert arm["status"] == "ok", (name, arm.get("error"))
        assert arm["real_tokens_per_s"] > 0, name
        assert arm["mfu"] is not None or arm["mfu_null_reason"], name
        assert arm["peak_memory_mib"] > 0, name
        fit = arm["fit"]
        assert fit is not None or arm["fit_skipped_reason"], name
        assert fit["largest_groups"] >= 1 and fit["tries"], name
        assert arm["tokens_per_s_vs_padded"] > 0 and arm["tokens_per_s_vs_bare"] > 0
        assert f"| {name} |" in doc["table_markdown"] and f"| {name} |" in stdout
