"""``benchmarks/vs_trl/run.py --tiny``: the JSON has every figure, parity passed, and a parity
mismatch is refused before anything is timed.

A schema check on 3 steps of 4 prompts x 4 samples, one seed (not a measurement: no number is
asserted beyond being present and well-formed). Both systems run for real: TRL's
GRPOTrainer in the worker process and ``asyncrl run`` with its vLLM actor (~1.5 min here).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.common import read_result
from tests.e2e.conftest import REPO, needs_full_stack

pytest.importorskip("trl", reason="needs TRL: pip install -e '.[bench]' (make test installs it)")

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.redis]

PER_RUN = {"steps", "startup_s", "train_s", "total_s", "steps_per_s", "steps_per_s_with_startup",
           "reward_initial", "reward_final", "completion_tokens_mean", "time_to_threshold"}  # fmt: skip


def _run(out, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "benchmarks.vs_trl", "--tiny", "--out", str(out),
           "--runs-dir", str(out / "runs"), *extra]  # fmt: skip
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    needs_full_stack()
    out = tmp_path_factory.mktemp("vs_trl")
    proc = _run(out)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return out, read_result(out / "vs_trl_tiny.json"), proc.stdout  # with its per-step traces


def test_provenance_config_and_pinning(result):
    _, doc, _ = result
    for key in ("name", "created", "command", "commit", "machine", "config", "pinning"):
        assert doc[key], key
    assert doc["command"].startswith("python -m benchmarks.vs_trl --tiny")
    assert str(REPO) not in doc["command"] and sys.executable not in doc["command"]
    cfg = doc["config"]
    assert cfg["setting"] == "demo" and cfg["steps"] == 3 and cfg["seeds"] == [0]
    trl = cfg["trl_grpo_config"]
    assert trl["loss_type"] == "dapo" and trl["beta"] == 0.0 and trl["num_iterations"] == 1
    assert trl["per_device_train_batch_size"] == 16 and trl["num_generations"] == 4
    assert trl["bf16"] is False and trl["shuffle_dataset"] is False
    assert set(cfg["asyncrl_extra_overrides"]) == {"learner.checkpoint_every=0", "metrics_port=0"}
    assert "torch.set_num_threads(2)" in doc["pinning"]["trl"]
    asyncrl = doc["pinning"]["asyncrl"]
    assert "cpu_affinity: auto" in asyncrl and "learner 1 rank(s)" in asyncrl, asyncrl


def test_parity_passed(result):
    _, doc, _ = result
    parity = doc["parity"]
    assert parity["passed"] is True
    seed0 = parity["per_seed"]["0"]
    assert seed0["failures"] == [] and seed0["cases"] == 20
    assert seed0["rewards_compared"] >= 20 * 8
    for name, (ours, theirs) in seed0["settings"].items():
        assert ours == theirs, name


def test_every_run_and_figure(result):
    _, doc, stdout = result
    assert {(r["system"], r["seed"]) for r in doc["runs"]} == {("trl", 0), ("asyncrl", 0)}
    for run in doc["runs"]:
        assert run["returncode"] == 0 and [s["step"] for s in run["steps"]] == [1, 2, 3]
        assert run["startup_s"] > 0
        for s in run["steps"]:
            assert s["t_proc_s"] == pytest.approx(run["startup_s"] + s["t_train_s"], abs=0.05)
            assert 0.0 <= s["reward"] <= 1.0
    for fig in doc["per_run"]:
        assert not PER_RUN - set(fig), fig["system"]
        assert set(fig["time_to_threshold"]) == {"0.3", "0.4", "0.5", "0.6"}
    for system in ("trl", "asyncrl"):
        agg = doc["systems"][system]
        assert set(agg["steps_per_s"]) == {"mean", "std", "n"} and agg["steps_per_s"]["n"] == 1
        assert agg["time_to_threshold"]["0.3"]["reached"].endswith("/1")
    assert doc["asyncrl_vs_trl"]["steps_per_s_ratio"] > 0
    assert doc["verdicts"] and doc["verdicts"][0] in stdout


def test_plot_is_written(result):
    out, doc, _ = result
    with open(out / "vs_trl_tiny.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert doc["plot"].endswith("vs_trl_tiny.png")


def test_parity_mismatch_is_refused(tmp_path):
    """asyncrl set to a loss aggregation this TRL configuration does not run: exit 2 with the
    mismatch named, before any timed run, and no result written."""
    needs_full_stack()
    proc = _run(tmp_path, "--set", "algorithm.aggregation=seq_mean_token_mean")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "PARITY FAILED" in proc.stderr and "aggregation" in proc.stderr
    assert not (tmp_path / "vs_trl_tiny.json").exists()
    assert not (tmp_path / "runs" / "vs_trl_tiny" / "trl-seed0").exists()


def test_long_tail_setting_prepares_and_passes_parity(tmp_path):
    """The long_tail setting (its prompt file, its warm-started model at the tiny size, the
    addition reward on its ``answer`` column) passes the same parity check before anything
    is timed."""
    needs_full_stack()
    proc = _run(tmp_path, "--setting", "long_tail", "--parity-only")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "[vs_trl] parity seed 0: 20 prompts" in proc.stdout and "0 mismatches" in proc.stdout
    assert "--parity-only: no timed run" in proc.stdout
    assert not (tmp_path / "vs_trl_long_tail_tiny.json").exists()
    data = tmp_path / "runs" / "vs_trl_long_tail_tiny" / "long_tail_data" / "seed0.jsonl"
    first = json.loads(data.read_text().splitlines()[0])
    assert set(first) == {"prompt", "answer"} and first["prompt"].endswith("=")


def test_reanalyse_reports_the_same_runs_at_other_thresholds(result):
    out, doc, _ = result
    cmd = [sys.executable, "-m", "benchmarks.vs_trl", "--reanalyse", str(out / "vs_trl_tiny.json"),
           "--thresholds", "0.0", "0.99", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    again = read_result(out / "vs_trl_tiny_reanalysed.json")
    assert again["reanalysed_from"]["commit"] == doc["commit"]
    assert again["runs"] == doc["runs"] and again["config"]["thresholds"] == [0.0, 0.99]
    for fig in again["per_run"]:
        assert set(fig["time_to_threshold"]) == {"0.0", "0.99"}
        assert fig["time_to_threshold"]["0.0"]["train_s"] is not None  # every run reaches 0
    assert (out / "vs_trl_tiny_reanalysed.png").is_file()


def test_smollm2_setting_passes_parity(tmp_path, smollm2_dir):
    """The smollm2 setting (the real SmolLM2-135M-Instruct, chat-templated verl prompts,
    math_reward with \\boxed{} answers, asyncrl's stop ids, greedy validation on the val set)
    passes parity before anything is timed (~40 s; its 2-step run takes ~15 min on 2 cores,
    too long for a test)."""
    proc = _run(tmp_path, "--setting", "smollm2", "--parity-only")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("[vs_trl] parity seed 0"))
    assert "20 prompts" in line and "64 validation prompts" in line and "0 mismatches" in line
    parity = tmp_path / "runs" / "vs_trl_smollm2_tiny" / "parity-seed0" / "parity.json"
    settings = json.loads(parity.read_text())["settings"]
    assert settings["stop_token_ids"][0] == settings["stop_token_ids"][1] != []
    assert settings["max_new_tokens"] == [128, 128] and settings["temperature"] == [0.7, 0.7]
    assert settings["val_greedy (eval.n_samples=1)"] == [True, True]
