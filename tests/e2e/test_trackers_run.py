"""A real ``asyncrl run`` (simulated actor) with every logger: the TensorBoard event files,
the MLflow file store and the W&B offline run under the run directory hold every step's
training metrics, the config and the summary, and each validation's samples (the same first
prompts at start and at the end, their completions as val.jsonl has them); config.yaml sits
beside config.json; the console line shows progress, loss and KL, and the samples. W&B and
MLflow must not need the network: the run is bounded at 90 s (a blocked network call would
hang it)."""

import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

from asyncrl.core.observe import trackers
from asyncrl.learner.hub.runlog import sample_line
from tests import readback
from tests.e2e.conftest import REPO, asyncrl_cmd

pytestmark = [pytest.mark.slow, pytest.mark.redis]

STEPS = 4  # experiment=tiny
VERSIONS = [0, STEPS]  # validated: eval.at_start, eval.at_end
SHOWN = 2  # eval.log_samples


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
    if shutil.which("redis-server") is None:
        pytest.skip("install redis-server (apt-get install -y redis-server) to run this test")
    for lib in ("tensorboard", "wandb", "mlflow"):
        pytest.importorskip(lib, reason=f"pip install 'asyncrl[{lib}]' (make test does)")
    run_dir = tmp_path_factory.mktemp("logged") / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    args = ["run", "experiment=tiny", "actor.engine=sim", "metrics_port=0", f"run_dir={run_dir}",
            "logger=[console,jsonl,tensorboard,mlflow,wandb]", "project_name=tracked",
            "eval.at_start=true", "eval.at_end=true", "eval.max_prompts=4",
            f"eval.log_samples={SHOWN}"]  # fmt: skip
    proc = subprocess.run(asyncrl_cmd(*args), cwd=REPO, env={**env, "PYTHONUNBUFFERED": "1"},
                          capture_output=True, text=True, timeout=90)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return run_dir, proc.stdout


def test_config_yaml_beside_config_json(logged_run):
    run_dir, _ = logged_run
    config = json.loads((run_dir / "config.json").read_text())
    assert yaml.safe_load((run_dir / "config.yaml").read_text()) == config
    assert config["experiment_name"] == "run"  # the run directory's name


def test_console_line_shows_progress_loss_and_kl(logged_run):
    _, out = logged_run
    lines = re.findall(r"^step +\d+ \|.*$", out, re.M)
    assert len(lines) == STEPS, out[-3000:]
    assert re.match(
        r"step +3 \| 4/4 ETA 0s \| reward [\d.]+ \| loss \S+ \| kl_behave \S+ \|", lines[-1]
    )


def test_tensorboard_has_every_step(logged_run):
    run_dir, _ = logged_run
    scalars = readback.tensorboard_scalars(run_dir / "tensorboard")
    for tag in ("train/reward", "train/loss", "train/approx_kl_behave", "time/step_s"):
        assert [step for step, _ in scalars[tag]] == list(range(STEPS)), tag
    summary = json.loads((run_dir / "summary.json").read_text())
    assert scalars["summary/steps"] == [(STEPS - 1, STEPS)]
    assert scalars["summary/groups_trained"] == [(STEPS - 1, summary["groups_trained"])]
    assert "learner:" in readback.tensorboard_text(run_dir / "tensorboard", "config")


def test_mlflow_has_every_step_and_the_config(logged_run):
    run_dir, _ = logged_run
    (run,) = readback.mlflow_runs(run_dir / "mlruns")
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    history = readback.mlflow_history(run_dir / "mlruns", run.info.run_id, "train/loss")
    assert [step for step, _ in history] == [r["step"] for r in metrics]
    assert [value for _, value in history] == pytest.approx([r["loss"] for r in metrics])
    assert run.data.params["learner.steps"] == str(STEPS)
    assert run.data.params["project_name"] == "tracked"
    assert run.data.metrics["summary/steps"] == STEPS


def test_wandb_offline_run_has_every_step(logged_run):
    run_dir, _ = logged_run
    run = readback.wandb_offline_run(run_dir / "wandb")
    assert (run["project"], run["name"], run["finished"]) == ("tracked", "run", True)
    steps = [h["_step"] for h in run["history"] if "train/reward" in h]
    assert steps == list(range(STEPS))
    assert run["config"]["learner"]["steps"] == STEPS
    assert run["summary"]["steps"] == STEPS


def _validations(run_dir) -> list[dict]:
    val = [json.loads(line) for line in (run_dir / "val.jsonl").read_text().splitlines()]
    assert [r["val/version"] for r in val] == VERSIONS, val
    return val


def test_val_jsonl_and_the_console_show_the_same_first_prompts_at_every_version(logged_run):
    run_dir, out = logged_run
    val = _validations(run_dir)
    for r in val:
        assert [s["index"] for s in r["samples"]] == list(range(SHOWN)), r
        assert all(isinstance(s["completion"], str) and s["reward"] >= 0 for s in r["samples"])
        for s in r["samples"]:  # validation v0 prompt 0 | reward 0.000 | "7+651=" -> "n"
            assert f"\n{sample_line(s, int(r['val/version']))}\n" in out, out[-3000:]
    assert [s["prompt"] for s in val[0]["samples"]] == [s["prompt"] for s in val[1]["samples"]]
    assert json.loads((run_dir / "summary.json").read_text())["validation"] == val


def test_each_tracker_has_the_samples_of_each_validation(logged_run):
    run_dir, _ = logged_run
    val = _validations(run_dir)
    shown = [(r["step"], int(r["val/version"]), r["samples"]) for r in val]
    tables = [
        (step, {"columns": list(trackers.SAMPLE_COLUMNS), "data": trackers.sample_rows(s, v)})
        for step, v, s in shown
    ]
    texts = readback.tensorboard_texts(run_dir / "tensorboard", "val/samples")
    assert texts == [(step, trackers.samples_markdown(s, v)) for step, v, s in shown]
    assert readback.wandb_tables(run_dir / "wandb", "val/samples") == tables
    (run,) = readback.mlflow_runs(run_dir / "mlruns")
    artifacts = readback.mlflow_json_artifacts(run_dir / "mlruns", run.info.run_id, "val_samples")
    names = [f"val_samples/v{v:06d}.json" for _, v, _ in shown]
    assert artifacts == dict(zip(names, [t for _, t in tables], strict=True))
