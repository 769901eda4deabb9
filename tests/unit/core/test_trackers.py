"""Experiment trackers (asyncrl/core/observe/trackers.py): each backend logs a few steps, the config, two
validations' samples and the summary, and the test reads back what the real library wrote
(TensorBoard event files, the MLflow file store, the W&B offline run file). Also: the
``logger`` list's validation, the error naming the pip extra when a library is missing, the
console lines (a step's, a validation's samples shortened), ``--cfg``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from asyncrl.core.config.job import Config
from asyncrl.core.config.load import ConfigError, config_to_yaml, load_config
from asyncrl.core.observe import trackers
from asyncrl.learner.hub.runlog import (
    CONSOLE_TEXT_CHARS,
    RunLog,
    console_line,
    format_duration,
    shorten,
)
from tests import readback

ROOT = Path(__file__).resolve().parents[3]
STEPS = [{"train/loss": 1.0 - 0.25 * i, "val/reward": 0.5 + 0.1 * i} for i in range(3)]
CONFIG = {"learner": {"lr": 0.0002, "steps": 3}, "mode": {"name": "async"}}
SUMMARY = {"reward_final": 0.75, "learner_time_s/busy": 1.5}
# a long completion with Markdown's special characters, kept whole by every tracker
LONG = "Let me think.\n| a | b |\n**not bold** <b>x</b>\n" + "step " * 80 + "\nso: 46"
SAMPLES = {  # step -> (version, samples): validations at steps 0 and 2
    0: (1, [{"index": 0, "prompt": "12+34=", "completion": "4", "reward": 0.0},
            {"index": 1, "prompt": "Q:\n7+1=", "completion": LONG, "reward": 0.0}]),
    2: (3, [{"index": 0, "prompt": "12+34=", "completion": "46", "reward": 1.0},
            {"index": 1, "prompt": "Q:\n7+1=", "completion": "8", "reward": 1.0}]),
}  # fmt: skip
TABLES = {
    step: {"columns": list(trackers.SAMPLE_COLUMNS), "data": trackers.sample_rows(s, v)}
    for step, (v, s) in SAMPLES.items()
}


@pytest.fixture(autouse=True)
def _restore_environ():
    """The trackers set defaults in os.environ (WANDB_SILENT, MLFLOW_ALLOW_FILE_STORE, ...)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def _exercise(tracker) -> None:
    tracker.log_config(CONFIG)
    for step, metrics in enumerate(STEPS):
        tracker.log(metrics, step)
        if step in SAMPLES:
            version, samples = SAMPLES[step]
            tracker.log_samples(samples, version, step)
    tracker.log_summary(SUMMARY, len(STEPS) - 1)
    tracker.close()


# -- the logger list -----------------------------------------------------------------------


def test_logger_defaults_and_list_override():
    assert load_config([]).logger == ["console", "jsonl"]
    cfg = load_config(["logger=[console,jsonl,tensorboard,wandb,mlflow]", "project_name=p"])
    assert cfg.logger == ["console", "jsonl", "tensorboard", "wandb", "mlflow"]
    assert (cfg.project_name, cfg.experiment_name) == ("p", "")
    assert load_config(["logger=[]"]).logger == []


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("logger=[console,tb]", "logger: unknown 'tb'; known: console, jsonl, tensorboard, wandb, mlflow"),
        ("logger=[wandb,console,wandb]", "logger lists wandb more than once"),
        ("logger=wandb", "logger: expected a list ([a,b] in an override), got 'wandb'"),
        ("project_name=", "project_name is empty"),
    ],
)  # fmt: skip
def test_logger_mistakes_are_config_errors(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config([override])


# -- names -----------------------------------------------------------------------------------


def test_step_records_are_grouped_by_prefix():
    record = {"step": 4, "version": 5, "reward": 0.5, "loss": 0.1, "busy_s": 0.2, "wall_s": 9.0,
              "val/reward": 0.7, "mode": "async"}  # fmt: skip
    assert trackers.step_metrics(record) == {
        "train/version": 5.0, "train/reward": 0.5, "train/loss": 0.1, "time/busy_s": 0.2,
        "time/wall_s": 9.0, "val/reward": 0.7,
    }  # fmt: skip
    summary = {"steps": 3, "mode": "async", "reward_final": float("nan"),
               "learner_time_s": {"busy": 1.5}, "weight_sync": {"count": 2}}  # fmt: skip
    assert trackers.summary_metrics(summary) == {
        "steps": 3.0,
        "learner_time_s/busy": 1.5,
        "weight_sync/count": 2.0,
    }


# -- each backend, read back -----------------------------------------------------------------


def test_tensorboard_writes_event_files(tmp_path):
    pytest.importorskip("tensorboard", reason="pip install 'asyncrl[tensorboard]' (make test does)")
    _exercise(trackers.TensorBoardTracker(tmp_path))
    scalars = readback.tensorboard_scalars(tmp_path / "tensorboard")
    assert scalars["train/loss"] == [(0, 1.0), (1, 0.75), (2, 0.5)]
    assert [step for step, _ in scalars["val/reward"]] == [0, 1, 2]
    assert scalars["summary/reward_final"] == [(2, 0.75)]
    text = readback.tensorboard_text(tmp_path / "tensorboard", "config")
    assert yaml.safe_load("\n".join(line[4:] for line in text.splitlines())) == CONFIG
    texts = readback.tensorboard_texts(tmp_path / "tensorboard", "val/samples")
    assert [step for step, _ in texts] == [0, 2]
    assert texts[0][1] == trackers.samples_markdown(SAMPLES[0][1], 1)
    assert "**v3 prompt 0** (reward 1)\n\n    12+34=\n\ncompletion:\n\n    46\n" in texts[1][1]


def test_tensorboard_samples_keep_the_text_whole_in_code_blocks():
    text = trackers.samples_markdown(SAMPLES[0][1], 1)
    heading, prompt, _, completion = text.split("\n\n")[-4:]
    assert heading == "**v1 prompt 1** (reward 0)"
    assert prompt == "    Q:\n    7+1="  # each line indented: a Markdown code block
    assert "\n".join(line[4:] for line in completion.split("\n")[:-1]) == LONG


def test_mlflow_writes_a_file_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="pip install 'asyncrl[mlflow]' (make test does)")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    _exercise(trackers.MlflowTracker(tmp_path, "proj", "exp1"))
    (run,) = readback.mlflow_runs(tmp_path / "mlruns")
    assert run.info.run_name == "exp1" and run.info.status == "FINISHED"
    history = readback.mlflow_history(tmp_path / "mlruns", run.info.run_id, "train/loss")
    assert history == [(0, 1.0), (1, 0.75), (2, 0.5)]
    assert run.data.metrics["summary/reward_final"] == 0.75
    assert run.data.params == {"learner.lr": "0.0002", "learner.steps": "3", "mode.name": "async"}
    tables = readback.mlflow_json_artifacts(tmp_path / "mlruns", run.info.run_id, "val_samples")
    assert tables == {"val_samples/v000001.json": TABLES[0], "val_samples/v000003.json": TABLES[2]}
    assert tables["val_samples/v000001.json"]["data"][1][3] == LONG
    experiment = readback.mlflow_client(tmp_path / "mlruns").get_experiment(run.info.experiment_id)
    assert experiment.name == "proj"


def test_wandb_writes_an_offline_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="pip install 'asyncrl[wandb]' (make test does)")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    _exercise(trackers.WandbTracker(tmp_path, "proj", "exp1"))
    run = readback.wandb_offline_run(tmp_path / "wandb")
    assert (run["project"], run["name"], run["finished"]) == ("proj", "exp1", True)
    assert [(h["_step"], h["train/loss"]) for h in run["history"]] == [
        (0, 1.0),
        (1, 0.75),
        (2, 0.5),
    ]
    assert run["config"]["learner"] == CONFIG["learner"]
    assert run["summary"]["reward_final"] == 0.75
    tables = readback.wandb_tables(tmp_path / "wandb", "val/samples")
    assert tables == [(0, TABLES[0]), (2, TABLES[2])]
    assert tables[0][1]["data"][1] == [1, 1, "Q:\n7+1=", LONG, 0.0]


@pytest.mark.parametrize("name", ["tensorboard", "wandb", "mlflow"])
def test_a_missing_library_names_the_pip_extra(name, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, name, None)  # `import name` raises ImportError
    extra = re.escape(f"pip install 'asyncrl[{name}]'")
    with pytest.raises(trackers.TrackerUnavailable, match=extra):
        trackers.check_available(["console", "jsonl", name])
    cfg = Config(logger=[name], run_dir=str(tmp_path))
    with pytest.raises(trackers.TrackerUnavailable, match=extra):
        trackers.open_trackers(cfg, tmp_path)
    trackers.check_available(["console", "jsonl"])  # the built-in ones need nothing


# -- the run log: console line and fan-out ---------------------------------------------------


def _record(step: int, **extra) -> dict:
    return {"step": step, "version": step + 1, "reward": 0.5, "staleness_max": 1,
            "staleness_mean": 0.25, "groups_per_s": 2.0, "tokens_per_s": 300.0,
            "dropped_stale": 0, "dropped_invalid": 0, "wall_s": float(step), **extra}  # fmt: skip


def test_console_line_shows_progress_loss_kl_and_validation():
    r = _record(1, loss=0.0123, approx_kl_behave=0.00042)
    line = console_line(r, total_steps=400, eta_s=185.0, val_reward=0.6)
    assert line.startswith("step    1 | 2/400 ETA 3m05s | reward 0.500 | loss 0.0123 | ")
    assert "| kl_behave 0.00042 | val_reward 0.600 | stale max 1 mean 0.25 |" in line
    assert re.match(r"^step +1 \|", line) and "dropped stale 0 invalid 0" in line
    assert console_line(_record(0)).startswith("step    0 | v1 | reward 0.500 | stale max")
    assert [format_duration(s) for s in (59.4, 185, 7620)] == ["59s", "3m05s", "2h07m"]


class RecordingTracker:
    def __init__(self) -> None:
        self.steps: list[tuple[int, dict]] = []
        self.summary: tuple[dict, int] | None = None
        self.samples: list[tuple[int, int, list]] = []
        self.closed = False

    def log(self, metrics, step):
        self.steps.append((step, metrics))

    def log_summary(self, summary, step):
        self.summary = (summary, step)

    def log_samples(self, samples, version, step):
        self.samples.append((step, version, samples))

    def close(self, status="FINISHED"):
        self.closed = status


def test_run_log_feeds_trackers_and_carries_the_latest_validation_reward(tmp_path, capsys):
    fake = RecordingTracker()
    log = RunLog(tmp_path, total_steps=10, trackers=[fake])
    log.log(_record(0, step_s=2.0, loss=0.5))
    val = {"step": 0, "val/version": 1.0, "val/reward": 0.8, "val/pass@1": 0.5,
           "val/prompts": 4.0, "val/seconds": 1.5, "val/complete": 1.0}  # fmt: skip
    log.log_val(val)
    log.log(_record(1, step_s=4.0))
    log.log(_record(2, step_s=3.0))
    summary = log.write_summary({"mode": "async"})
    log.close()
    lines = capsys.readouterr().out.splitlines()
    assert "1/10 ETA 18s" in lines[0] and "val_reward" not in lines[0]
    assert lines[1] == (
        "validation v1 (step 0) | val/reward 0.800 | pass@1 0.500 | 4 prompts in 1.5 s"
    )
    assert "3/10 ETA 21s" in lines[3] and "val_reward 0.800" in lines[3]  # 7 steps x 3 s
    assert [s for s, _ in fake.steps] == [0, 0, 1, 2]
    assert fake.steps[0][1]["train/loss"] == 0.5 and fake.steps[1][1]["val/reward"] == 0.8
    assert summary["validation"] == [val]
    assert (tmp_path / "val.png").is_file() and (tmp_path / "val.jsonl").is_file()
    assert fake.summary == ({"steps": 3.0, **_numbers(summary)}, 2) and fake.closed
    # a resumed learner shows the last validation reward of the records before it
    again = RunLog(tmp_path, quiet=True)
    assert again.val_reward == 0.8 and again.val_records == [val]
    again.close()


def test_a_validation_s_samples_go_whole_to_val_jsonl_and_trackers_and_short_to_the_console(
    tmp_path, capsys
):
    fake = RecordingTracker()
    log = RunLog(tmp_path, trackers=[fake])
    version, samples = SAMPLES[0]
    val = {"step": 0, "val/version": float(version), "val/reward": 0.0, "val/prompts": 2.0,
           "val/seconds": 1.5, "val/complete": 1.0, "samples": samples}  # fmt: skip
    log.log_val(val)
    log.log_val({**val, "step": 1, "val/version": 2.0, "samples": []})  # none came back
    log.close()
    assert fake.samples == [(0, 1, samples)]  # the version as an int; no empty table
    assert [s for s, _ in fake.steps] == [0, 1] and "samples" not in fake.steps[0][1]
    first = json.loads((tmp_path / "val.jsonl").read_text().splitlines()[0])
    assert first["samples"][1]["completion"] == LONG
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("validation v1 (step 0) | val/reward 0.000 |")
    assert lines[1] == 'validation v1 prompt 0 | reward 0.000 | "12+34=" -> "4"'
    short = json.dumps(shorten(LONG))
    assert lines[2] == f'validation v1 prompt 1 | reward 0.000 | "Q:\\n7+1=" -> {short}'
    assert lines[3].startswith("validation v2 (step 1)") and len(lines) == 4


def test_shorten_keeps_the_start_and_the_end_and_counts_what_it_left_out():
    assert shorten("12+34=") == "12+34="
    assert shorten("x" * CONSOLE_TEXT_CHARS) == "x" * CONSOLE_TEXT_CHARS
    text = "".join(chr(ord("a") + i % 26) for i in range(300))
    short = shorten(text, limit=30)
    assert short == f"{text[:10]} ...[270 chars]... {text[-20:]}"
    assert len(shorten(LONG)) < CONSOLE_TEXT_CHARS + 25 and shorten(LONG).endswith("so: 46")


def _numbers(summary: dict) -> dict:
    return {k: float(v) for k, v in summary.items() if isinstance(v, (int, float))}


# -- the composed config as YAML -------------------------------------------------------------


def test_cfg_prints_the_composed_config_and_starts_nothing(tmp_path):
    overrides = ["learner.steps=7", "logger=[console,tensorboard]", f"run_dir={tmp_path}/new"]
    out = subprocess.run(
        [sys.executable, "-m", "asyncrl.orchestration.cli", "run", "--cfg", *overrides],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=True,
    )  # fmt: skip
    printed = yaml.safe_load(out.stdout)
    assert printed["learner"]["steps"] == 7 and printed["logger"] == ["console", "tensorboard"]
    assert printed["buffer"]["capacity"] > 0  # the validated config: auto values resolved
    assert out.stdout == config_to_yaml(load_config(overrides))
    assert not (tmp_path / "new").exists()
