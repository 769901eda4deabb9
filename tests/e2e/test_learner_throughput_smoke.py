"""``benchmarks/learner/throughput.py --preset tiny``: the JSON is complete.

A schema check on the tiny preset end to end (random model saved and loaded, every arm in its
worker processes, the fit search of a learner arm and a bare one, ``--fit-arms``), not a
measurement: no figure is asserted beyond being present and well-formed. ~50 s on 2 shared
cores (short worker processes; a fit search of the other three arms, the same code at the same
batch, took ~20 s more). Then the
``smollm2`` preset at a tiny batch: the real SmolLM2-135M-Instruct (``smollm2_dir``) stepped by
asyncrl and the bare loop, paired per round (~30 s more). The actor's side for SmolLM2
(``micro_overheads actor --model smollm2``) has no smoke test: two vLLM engines' starts and
its rounds alone take longer than this file's budget.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ARMS = ["padded", "asyncrl", "bare", "extra", "bare_x"]
FIT_ARMS = ["asyncrl", "bare"]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("throughput")
    cmd = [sys.executable, "-m", "benchmarks.learner.throughput", "--preset", "tiny",
           "--rounds", "1", "--repeat", "1", "--out", str(out), "--name", "smoke",
           "--arm", "extra:model.logprob_chunk_tokens=16,threads=1",
           "--arm", "bare_x:chunk=16,threads=1", "--fit-arms", ",".join(FIT_ARMS)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads((out / "smoke.json").read_text()), proc.stdout, out


def test_provenance(result):
    doc, _, _ = result
    for key in ("name", "created", "command", "commit", "machine", "config", "versions"):
        assert doc[key], key
    assert doc["command"].startswith("python -m benchmarks.learner.throughput --preset tiny")
    assert doc["machine"]["cpu"] and doc["machine"]["torch"]
    cfg = doc["config"]
    assert cfg["preset"] == "tiny" and cfg["device"] == "cpu" and cfg["n_params"] > 0
    assert cfg["threads"]["worker"]["torch_threads"] >= 1
    assert doc["batch"]["real_tokens"] > 0
    assert "gpu" in doc  # null on CPU


def test_the_json_is_written_after_every_arm(result):
    """A run cut short (the GPU check's deadline) keeps the arms it measured: the JSON is
    rewritten after each arm's worker, saying which were still to run; the last is whole."""
    doc, stdout, _ = result
    assert "wrote smoke.json (written before asyncrl (round 1), bare (round 1)," in stdout
    assert "wrote smoke.json (written before bare_x (round 1) ran)" in stdout
    assert "partial" not in doc and list(doc["arms"]) == ARMS


def test_every_arm_has_every_figure(result):
    doc, stdout, out = result
    assert list(doc["arms"]) == ARMS
    assert "model.logprob_chunk_tokens=16" in doc["arms"]["extra"]["overrides"]
    assert (out / "smoke.png").stat().st_size > 0
    for name, arm in doc["arms"].items():
        assert arm["status"] == "ok", (name, arm.get("error"))
        assert arm["real_tokens_per_s"] > 0, name
        assert arm["mfu"] is not None or arm["mfu_null_reason"], name
        assert arm["peak_memory_mib"] > 0, name
        fit = arm["fit"]
        if name in FIT_ARMS:
            assert fit is not None and arm["fit_skipped_reason"] is None, name
            assert fit["largest_groups"] >= 1 and fit["tries"], name
        else:
            assert fit is None, name
            assert arm["fit_skipped_reason"] == f"not in --fit-arms ({','.join(FIT_ARMS)})", name
        assert arm["tokens_per_s_vs_padded"] > 0 and arm["tokens_per_s_vs_bare"] > 0
        assert f"| {name} |" in doc["table_markdown"] and f"| {name} |" in stdout


def test_learner_arms_pair_with_the_bare_arm_of_their_threads_and_dtype(result):
    doc, stdout, _ = result
    arms = doc["arms"]
    assert arms["bare_x"]["kind"] == "bare" and arms["bare_x"]["settings"]["chunk"] == 16
    assert arms["extra"]["threads"] == "1" and "threads=1" not in arms["extra"]["overrides"]
    assert arms["asyncrl"]["vs_ref"]["ref"] == "bare"
    assert arms["extra"]["vs_ref"]["ref"] == "bare_x"  # same threads, not the first bare arm
    for name in ("padded", "asyncrl", "extra"):
        v = arms[name]["vs_ref"]
        assert len(v["per_round"]) == 1 and v["median"] == v["per_round"][0] > 0, name
    assert arms["bare"]["vs_ref"] is None
    assert "round 1 tok/s" in doc["rounds_table_markdown"] and "round 1 tok/s" in stdout
    assert "pinned: each arm's worker process runs 1 torch thread(s)" in stdout


def test_smollm2_preset_steps_the_real_model(smollm2_dir, tmp_path):
    cmd = [sys.executable, "-m", "benchmarks.learner.throughput", "--preset", "smollm2",
           "--groups", "1", "--n", "2", "--mean", "4", "--floor", "2", "--cap", "12",
           "--rounds", "1", "--repeat", "1", "--no-fit", "--out", str(tmp_path),
           "--name", "smol"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads((tmp_path / "smol.json").read_text())
    cfg = doc["config"]
    assert cfg["real_model"] == "smollm2" and cfg["n_params"] == 134_515_008  # tied: once
    assert "model=smollm2" in doc["arms"]["asyncrl"]["overrides"]
    assert list(doc["arms"]) == ["asyncrl", "bare"]
    assert doc["arms"]["asyncrl"]["vs_ref"]["ref"] == "bare"
    assert [t["target"].split(" (")[0] for t in doc["targets"]] == [
        "asyncrl >= 0.9x bare's real tokens/s"
    ]
    assert (tmp_path / "smol.png").stat().st_size > 0
