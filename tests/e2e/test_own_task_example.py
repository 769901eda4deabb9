"""The verl-style example a user copies (examples/own_task, docs/own_task.md) runs as written:
make_data.py writes verl's parquet layout, and the documented ``asyncrl run`` command trains on
it with the example's ``compute_score`` (simulated actor, real launcher, torchrun learner and
redis-server), validating at start, every 2 steps and at the end, and logging ``reward/acc`` and
``val/*`` to TensorBoard, MLflow and W&B (offline), each read back from what it wrote."""

import shutil
import subprocess
import sys

import pytest

from tests import readback
from tests.e2e.conftest import REPO, read_metrics, read_summary, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def test_own_task_example_runs_as_documented(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("install redis-server (apt-get install -y redis-server) to run this test")
    data = tmp_path / "own"
    make = [sys.executable, "examples/own_task/make_data.py", str(data), "--train-size", "64",
            "--val-size", "8"]  # fmt: skip
    subprocess.run(make, cwd=REPO, check=True, capture_output=True, text=True, timeout=60)
    run_dir = tmp_path / "run"
    # the command of docs/own_task.md, with the smoke-test budget appended
    args = ["run", "task=file", "data=verl", f"data.train_files=[{data}/train.parquet]",
            f"data.val_files=[{data}/val.parquet]", "data.max_prompt_length=64",
            "task.reward_fn=examples/own_task/reward.py:compute_score",
            "logger=[console,jsonl,tensorboard,mlflow,wandb]", "eval.every=2",
            "eval.at_start=true", "eval.at_end=true",
            "actor.engine=sim", "experiment=tiny", "metrics_port=0", "learner.nproc=1",
            f"run_dir={run_dir}"]  # fmt: skip
    proc = run_cli(args, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "data.train_files: 64 records; none longer than data.max_prompt_length=64" in out
    assert "data.val_files: 8 records" in out
    summary = read_summary(run_dir)
    assert summary["steps"] == 4, summary
    assert summary["reward_errors"]["count"] == 0, summary["reward_errors"]
    records = read_metrics(run_dir)
    assert len(records) == 4 and all("reward/acc" in r for r in records), records[-1]
    assert all(0.0 <= r["reward/acc"] <= 1.0 for r in records)
    assert (run_dir / "tensorboard").is_dir()
    # validation: v0 (at start), the first sync at/after step 2, and the final weights v4
    val = summary["validation"]
    assert [r["val/version"] for r in val] == [0.0, 2.0, 4.0], val
    assert all(r["val/prompts"] == 8 and r["val/complete"] == 1 for r in val), val
    assert all(0.0 <= r["val/acc"] <= 1.0 and "val/pass@1" in r for r in val), val
    assert "validation v4 (step 3) | val/reward" in out
    assert (run_dir / "val.png").is_file()
    want = [r["val/reward"] for r in val]
    tb = readback.tensorboard_scalars(run_dir / "tensorboard")
    assert [v for _, v in tb["val/reward"]] == pytest.approx(want)
    (run,) = readback.mlflow_runs(run_dir / "mlruns")
    assert run.info.status == "FINISHED"
    ml = readback.mlflow_history(run_dir / "mlruns", run.info.run_id, "val/reward")
    assert [v for _, v in ml] == pytest.approx(want)
    assert readback.mlflow_history(run_dir / "mlruns", run.info.run_id, "val/pass_at_1")
    wb = readback.wandb_offline_run(run_dir / "wandb")
    assert wb["finished"]
    assert [h["val/reward"] for h in wb["history"] if "val/reward" in h] == pytest.approx(want)


def test_the_jsonl_variant_with_an_asyncrl_signature_reward_runs_as_documented(tmp_path):
    """``make_data.py --format jsonl`` and the second command of docs/own_task.md: plain-text
    prompts used as they are, ``reward_plain.py:score(prompt, completion, answer)``."""
    if shutil.which("redis-server") is None:
        pytest.skip("install redis-server (apt-get install -y redis-server) to run this test")
    data = tmp_path / "own_jsonl"
    make = [sys.executable, "examples/own_task/make_data.py", str(data), "--format", "jsonl",
            "--train-size", "64", "--val-size", "8"]  # fmt: skip
    subprocess.run(make, cwd=REPO, check=True, capture_output=True, text=True, timeout=60)
    run_dir = tmp_path / "run"
    args = ["run", "task=file", f"data.train_files=[{data}/train.jsonl]",
            f"data.val_files=[{data}/val.jsonl]",
            "task.reward_fn=examples/own_task/reward_plain.py:score", "eval.every=2",
            "eval.at_start=true", "eval.max_prompts=64", "eval.n_samples=4",
            "actor.engine=sim", "experiment=tiny", "metrics_port=0", "learner.nproc=1",
            f"run_dir={run_dir}"]  # fmt: skip
    proc = run_cli(args, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "data.train_files: 64 records" in out and "data.val_files: 8 records" in out
    summary = read_summary(run_dir)
    assert summary["steps"] == 4 and summary["reward_errors"]["count"] == 0, summary
    val = summary["validation"]
    # at start, and the first sync at or after step 2; the one of v4, requested after the last
    # step without eval.at_end, is logged if it came in before the run ended, else withdrawn
    assert [r["val/version"] for r in val] in ([0.0, 2.0], [0.0, 2.0, 4.0]), val
    assert all(r["val/prompts"] == 8 and "val/pass@4" in r for r in val), val
