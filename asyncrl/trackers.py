"""Experiment trackers (``logger=[...]``): TensorBoard, Weights & Biases, MLflow.

Learner rank 0 only: ``asyncrl.runlog.RunLog`` hands every step record to each tracker
(``Tracker.log``), the run's config once when it opens them and the summary at the end.
Each backend imports its library when it opens, so a run without trackers imports none;
a missing library is a ``TrackerUnavailable`` naming the pip extra that installs it, raised
by ``check_available`` in the launcher before any process starts.

Metric names (the same in all three)::

    step record key                              tracker name
    a key with a '/' (val/reward, ...)           unchanged
    elapsed_s step_s busy_s waiting_data_s       time/<key>
    weight_sync_s checkpoint_s cpu_s wall_s
    everything else (reward, loss, kl, ...)      train/<key>
    summary.json numbers (nested: a/b)           summary/<key> (W&B: the run summary, <key>)

at the step of the record (``step``, 0-based: the record of version v is step v-1); the
summary at the last step. Where each writes:

    tensorboard  <run_dir>/tensorboard (event files; the config as a YAML text summary)
    wandb        <run_dir>/wandb (offline unless WANDB_MODE says otherwise; the config
                 as the run's config)
    mlflow       file:<run_dir>/mlruns unless MLFLOW_TRACKING_URI is set (the config as
                 params, keys dotted: learner.lr); experiment = project_name

A resumed learner (``learner.restart_max``) opens a new tracker run; its steps from the
checkpoint on appear twice in TensorBoard.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import time
from pathlib import Path
from typing import Protocol

EXTRAS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
"""logger name -> the pip extra (``pip install 'asyncrl[<extra>]'``) that installs it."""
_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
_TIME_KEYS = frozenset(
    ("elapsed_s", "step_s", "busy_s", "waiting_data_s", "weight_sync_s", "checkpoint_s", "cpu_s",
     "wall_s")
)  # fmt: skip


class TrackerUnavailable(RuntimeError):
    """A tracker's library is not installed; the message names the pip extra."""


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None:
        """Scalars (already named: ``train/loss``) at ``step``."""

    def log_config(self, config: dict) -> None:
        """The run's config (nested, as in config.json), once, right after opening."""

    def log_summary(self, summary: dict[str, float], step: int) -> None:
        """The final ``summary.json`` numbers (flat, ``a/b`` for nested keys)."""

    def close(self) -> None: ...


def _missing(name: str, why: str) -> TrackerUnavailable:
    return TrackerUnavailable(
        f"logger={name} needs the {_MODULES[name]} package ({why}); install it with "
        f"pip install 'asyncrl[{EXTRAS[name]}]', or leave {name} out of logger"
    )


def check_available(names: list[str]) -> None:
    """Raise ``TrackerUnavailable`` if a tracker named in ``names`` cannot be imported here."""
    for name in names:
        if name in _MODULES and importlib.util.find_spec(_MODULES[name]) is None:
            raise _missing(name, "not installed")


def _import(name: str):
    try:
        return importlib.import_module(_MODULES[name])
    except ImportError as e:
        raise _missing(name, str(e)) from None


def metric_name(key: str) -> str:
    if "/" in key:
        return key
    return f"time/{key}" if key in _TIME_KEYS else f"train/{key}"


def step_metrics(record: dict) -> dict[str, float]:
    """The numbers of a step record under their tracker names (``step`` is the x-axis)."""
    return {
        metric_name(k): float(v)
        for k, v in record.items()
        if k != "step" and isinstance(v, (int, float))
    }


def flatten(d: dict, sep: str, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a<sep>b": 1}``."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{sep}{k}" if prefix else str(k)
        out |= flatten(v, sep, key) if isinstance(v, dict) else {key: v}
    return out


def summary_metrics(summary: dict) -> dict[str, float]:
    """The finite numbers of ``summary.json``, nested keys joined by '/'."""
    flat = flatten(summary, "/")
    return {
        k: float(v)
        for k, v in flat.items()
        if isinstance(v, (int, float)) and math.isfinite(float(v))
    }


def open_trackers(cfg, run_dir: str | Path) -> list:
    """The trackers ``cfg.logger`` names (``console`` and ``jsonl`` are RunLog's own), open,
    with the run's config logged (``buffer.url``'s password masked)."""
    from dataclasses import asdict

    from buffer.connection import mask_url

    run_dir = Path(run_dir)
    project, name = cfg.project_name, cfg.experiment_name or run_dir.name
    makers = {
        "tensorboard": lambda: TensorBoardTracker(run_dir),
        "wandb": lambda: WandbTracker(run_dir, project, name),
        "mlflow": lambda: MlflowTracker(run_dir, project, name),
    }
    trackers = [makers[n]() for n in cfg.logger if n in makers]
    config = asdict(cfg)
    if config["buffer"]["url"]:
        config["buffer"]["url"] = mask_url(config["buffer"]["url"])
    for tracker in trackers:
        tracker.log_config(config)
    return trackers


class TensorBoardTracker:
    """``torch.utils.tensorboard.SummaryWriter`` on ``<run_dir>/tensorboard``."""

    def __init__(self, run_dir: Path) -> None:
        _import("tensorboard")  # torch's writer needs it; name the extra, not torch's message
        from torch.utils.tensorboard import SummaryWriter

        # flush every 10 s: a killed learner loses at most that much (the default is 120 s)
        self.writer = SummaryWriter(str(run_dir / "tensorboard"), flush_secs=10)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def log_config(self, config: dict) -> None:
        import yaml

        text = yaml.safe_dump(config, sort_keys=True)
        # TensorBoard renders text as Markdown: indent 4 spaces for a code block
        self.writer.add_text("config", "".join(f"    {line}\n" for line in text.splitlines()))

    def log_summary(self, summary: dict[str, float], step: int) -> None:
        self.log({f"summary/{k}": v for k, v in summary.items()}, step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run in ``<run_dir>/wandb``, offline unless ``WANDB_MODE`` is set."""

    def __init__(self, run_dir: Path, project: str, name: str) -> None:
        os.environ.setdefault("WANDB_SILENT", "true")  # our console line is the progress
        self._wandb = wandb = _import("wandb")
        self.run = wandb.init(
            project=project,
            name=name,
            dir=str(run_dir),
            mode=os.environ.get("WANDB_MODE") or "offline",
            # console="off": no wrapping of the learner's stdout (it is the launcher's log)
            settings=wandb.Settings(console="off", silent=True),
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_config(self, config: dict) -> None:
        self.run.config.update(config)

    def log_summary(self, summary: dict[str, float], step: int) -> None:
        self.run.summary.update(summary)

    def close(self) -> None:
        self.run.finish()
        # wait for W&B's service process to write everything: finish() can return before
        # the run file is flushed, and the learner leaves by os._exit (no atexit hooks)
        self._wandb.teardown()


class MlflowTracker:
    """An MLflow run in experiment ``project``: ``file:<run_dir>/mlruns`` unless
    ``MLFLOW_TRACKING_URI`` is set. MLflow 3 keeps the file store in maintenance mode behind
    ``MLFLOW_ALLOW_FILE_STORE``, set here for the default store; telemetry is off unless
    ``MLFLOW_DISABLE_TELEMETRY`` says otherwise (a run must not need the network)."""

    _PARAMS_PER_CALL = 100  # MLflow's log_batch limit

    def __init__(self, run_dir: Path, project: str, name: str) -> None:
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"file:{(run_dir / 'mlruns').resolve()}"
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        mlflow = _import("mlflow")
        from mlflow.entities import Metric, Param

        self._metric, self._param = Metric, Param
        self.client = mlflow.tracking.MlflowClient(uri)
        experiment = self.client.get_experiment_by_name(project)
        exp_id = experiment.experiment_id if experiment else self.client.create_experiment(project)
        self.run_id = self.client.create_run(exp_id, run_name=name).info.run_id

    def log(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        batch = [self._metric(k, v, now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def log_config(self, config: dict) -> None:
        params = [self._param(k, str(v)) for k, v in sorted(flatten(config, ".").items())]
        for i in range(0, len(params), self._PARAMS_PER_CALL):
            self.client.log_batch(self.run_id, params=params[i : i + self._PARAMS_PER_CALL])

    def log_summary(self, summary: dict[str, float], step: int) -> None:
        self.log({f"summary/{k}": v for k, v in summary.items()}, step)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
