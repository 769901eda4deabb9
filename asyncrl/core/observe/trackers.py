"""Experiment trackers (``logger=[...]``): TensorBoard, Weights & Biases, MLflow.

Learner rank 0 only: ``asyncrl.learner.hub.runlog.RunLog`` hands every step record to each tracker
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
summary at the last step. A validation's samples (``eval.log_samples``: the first prompts of
the validation set, each with its first completion, whole, and its reward) go, at the
validation's step, to each tracker as a table of ``SAMPLE_COLUMNS``. Where each writes:

    tensorboard  <run_dir>/tensorboard (event files; the config as a YAML text summary;
                 samples as the text summary val/samples, Markdown: ``samples_markdown``)
    wandb        <run_dir>/wandb (offline unless WANDB_MODE says otherwise; the config
                 as the run's config; samples as the table val/samples)
    mlflow       file:<run_dir>/mlruns unless MLFLOW_TRACKING_URI is set (the config as
                 params, keys dotted: learner.lr); experiment = project_name; samples as
                 the artifact val_samples/v<version, 6 digits>.json, {"columns", "data"}

One run across restarts: ``open_trackers`` keeps each tracker's run id in
``<run_dir>/trackers.json`` (written by learner rank 0 alone), so a learner restarted after a
crash (``learner.restart_max``) or a run resumed in its run_dir continues the same tracker run:
MLflow reopens it (RUNNING again; a config param it has keeps its first value, MLflow params
being immutable, and a changed one is set as the tag ``config_changed/<key>``), W&B inits
with that id and ``resume="allow"`` (offline: another ``offline-run-*`` directory with the
same id, which ``wandb sync`` appends), TensorBoard appends to the same directory. Steps
re-trained after a resume from a checkpoint appear twice, at the same step.

How a run ends (``close(status)``, ``CLOSE_STATUSES``): ``FINISHED`` (the run ended: steps,
data or a stop after training), ``FAILED`` (the learner crashed), ``KILLED`` (stopped before
its first step). MLflow records it as the run's status, W&B as the exit code.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

EXTRAS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
"""logger name -> the pip extra (``pip install 'asyncrl[<extra>]'``) that installs it."""
_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
CLOSE_STATUSES = {"FINISHED": 0, "FAILED": 1, "KILLED": 130}
"""How a tracker run ends (MLflow's run status) -> W&B's exit code (the learner's, for KILLED)."""
RUN_IDS = "trackers.json"
"""``<run_dir>/trackers.json``: ``{tracker name: run id}`` of the runs a restart continues."""
SAMPLE_COLUMNS = ("version", "index", "prompt", "completion", "reward")
"""A validation's samples as a table (one row per prompt; learner/hub/validation.py ``samples_of``)."""
_TIME_KEYS = frozenset(
    (
        "elapsed_s",
        "step_s",
        "busy_s",
        "waiting_data_s",
        "weight_sync_s",
        "checkpoint_s",
        "cpu_s",
        "wall_s",
    )
)


class TrackerUnavailable(RuntimeError):
    """A tracker's library is not installed; the message names the pip extra."""


class Tracker(Protocol):
    run_id: str
    """The id a restart continues (``<run_dir>/trackers.json``); "" when the run dir is it."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Scalars (already named: ``train/loss``) at ``step``."""

    def log_config(self, config: dict) -> None:
        """The run's config (nested, as in config.json), once, right after opening."""

    def log_summary(self, summary: dict[str, float], step: int) -> None:
        """The final ``summary.json`` numbers (flat, ``a/b`` for nested keys)."""

    def log_samples(self, samples: list[dict], version: int, step: int) -> None:
        """A validation's samples (``{"index", "prompt", "completion", "reward"}``) of the
        weights of ``version``, at ``step``; texts whole."""

    def close(self, status: str = "FINISHED") -> None:
        """End the run as ``status`` (a key of ``CLOSE_STATUSES``)."""


def exit_code(status: str) -> int:
    """W&B's exit code for ``status``; ``ValueError`` for one not in ``CLOSE_STATUSES``."""
    if status not in CLOSE_STATUSES:
        raise ValueError(f"tracker close status {status!r}; one of {', '.join(CLOSE_STATUSES)}")
    return CLOSE_STATUSES[status]


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


def mlflow_name(key: str) -> str:
    """MLflow refuses metric names outside ``[A-Za-z0-9_./ -]``: ``val/pass@4`` ->
    ``val/pass_at_4``, any other such character -> ``_``."""
    return re.sub(r"[^A-Za-z0-9_./ -]", "_", key.replace("@", "_at_"))


def step_metrics(record: dict) -> dict[str, float]:
    """The numbers of a step record under their tracker names (``step`` is the x-axis)."""
    return {
        metric_name(k): float(v)
        for k, v in record.items()
        if k != "step" and isinstance(v, (int, float))
    }


def sample_rows(samples: list[dict], version: int) -> list[list]:
    """``samples`` as rows of ``SAMPLE_COLUMNS``."""
    return [[version, s["index"], s["prompt"], s["completion"], s["reward"]] for s in samples]


def samples_markdown(samples: list[dict], version: int) -> str:
    """One TensorBoard text summary: per sample a heading line, then the prompt and the
    completion as code blocks (every line indented 4 spaces), so TensorBoard's Markdown shows
    the text as it is."""

    def block(text: str) -> str:
        return "".join(f"    {line}\n" for line in text.split("\n"))

    parts = [
        f"**v{version} prompt {s['index']}** (reward {s['reward']:.4g})\n\n{block(s['prompt'])}"
        f"\ncompletion:\n\n{block(s['completion'])}"
        for s in samples
    ]
    return "\n".join(parts)


def flatten(d: dict, sep: str, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a<sep>b": 1}``."""
    out: dict = {}
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
    with the run's config logged (``buffer.url``'s password masked). Each continues the run
    whose id ``<run_dir>/trackers.json`` holds, if any (module docstring); the ids of the runs
    open now are written there before anything is logged."""
    from asyncrl.core.config import env_refs
    from asyncrl.core.config.network import mask_url

    run_dir = Path(run_dir)
    project, name = cfg.project_name, cfg.experiment_name or run_dir.name
    ids = read_run_ids(run_dir)
    makers: dict[str, Callable[[], Tracker]] = {
        "tensorboard": lambda: TensorBoardTracker(run_dir),
        "wandb": lambda: WandbTracker(run_dir, project, name, ids.get("wandb")),
        "mlflow": lambda: MlflowTracker(run_dir, project, name, ids.get("mlflow")),
    }
    opened = {n: makers[n]() for n in cfg.logger if n in makers}
    if any(t.run_id for t in opened.values()):
        _write_run_ids(run_dir, ids | {n: t.run_id for n, t in opened.items() if t.run_id})
    trackers = list(opened.values())
    config = env_refs.written(cfg)  # ${oc.env:VAR} as that text, not its value
    if config["buffer"]["url"]:
        config["buffer"]["url"] = mask_url(config["buffer"]["url"])
    for tracker in trackers:
        tracker.log_config(config)
    return trackers


def read_run_ids(run_dir: Path) -> dict[str, str]:
    """``<run_dir>/trackers.json`` (``{}`` when absent or unreadable: new runs are opened)."""
    try:
        ids = json.loads((run_dir / RUN_IDS).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(ids, dict):
        return {}
    return {k: v for k, v in ids.items() if isinstance(k, str) and isinstance(v, str) and v}


def _write_run_ids(run_dir: Path, ids: dict[str, str]) -> None:
    tmp = run_dir / f".{RUN_IDS}.tmp"
    tmp.write_text(json.dumps(ids, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, run_dir / RUN_IDS)  # a learner killed mid-write leaves the old file


class TensorBoardTracker:
    """``torch.utils.tensorboard.SummaryWriter`` on ``<run_dir>/tensorboard``."""

    run_id = ""  # the directory is the run: a restart appends to it

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

    def log_samples(self, samples: list[dict], version: int, step: int) -> None:
        self.writer.add_text("val/samples", samples_markdown(samples, version), step)

    def close(self, status: str = "FINISHED") -> None:
        exit_code(status)  # checked; TensorBoard has nowhere to put it
        self.writer.close()


class WandbTracker:
    """A W&B run in ``<run_dir>/wandb``, offline unless ``WANDB_MODE`` is set; with
    ``run_id``, that run continued (``resume="allow"``: a new one if W&B has none by that id)."""

    def __init__(self, run_dir: Path, project: str, name: str, run_id: str | None = None) -> None:
        os.environ.setdefault("WANDB_SILENT", "true")  # our console line is the progress
        self._wandb = wandb = _import("wandb")
        self.run = wandb.init(
            project=project,
            name=name,
            dir=str(run_dir),
            mode=os.environ.get("WANDB_MODE") or "offline",
            id=run_id,
            resume="allow" if run_id else None,
            # console="off": no wrapping of the learner's stdout (it is the launcher's log)
            settings=wandb.Settings(console="off", silent=True),
        )
        self.run_id: str = self.run.id

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_config(self, config: dict) -> None:
        self.run.config.update(config)

    def log_summary(self, summary: dict[str, float], step: int) -> None:
        self.run.summary.update(summary)

    def log_samples(self, samples: list[dict], version: int, step: int) -> None:
        table = self._wandb.Table(columns=list(SAMPLE_COLUMNS), data=sample_rows(samples, version))
        self.run.log({"val/samples": table}, step=step)

    def close(self, status: str = "FINISHED") -> None:
        self.run.finish(exit_code=exit_code(status))
        # wait for W&B's service process to write everything: finish() can return before
        # the run file is flushed, and the learner leaves by os._exit (no atexit hooks)
        self._wandb.teardown()


class MlflowTracker:
    """An MLflow run in experiment ``project``: ``file:<run_dir>/mlruns`` unless
    ``MLFLOW_TRACKING_URI`` is set. MLflow 3 keeps the file store in maintenance mode behind
    ``MLFLOW_ALLOW_FILE_STORE``, set here for the default store; telemetry is off unless
    ``MLFLOW_DISABLE_TELEMETRY`` says otherwise (a run must not need the network). With
    ``run_id``, that run is reopened (RUNNING again) if the store has it, else a new one."""

    _PARAMS_PER_CALL = 100  # MLflow's log_batch limit (params, and tags)

    def __init__(self, run_dir: Path, project: str, name: str, run_id: str | None = None) -> None:
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"file:{(run_dir / 'mlruns').resolve()}"
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        mlflow = _import("mlflow")
        from mlflow.entities import Metric, Param, RunTag

        self._metric, self._param, self._tag = Metric, Param, RunTag
        self.client = mlflow.tracking.MlflowClient(uri)
        self._old_params = self._reopen(run_id)
        if self._old_params is None:
            experiment = self.client.get_experiment_by_name(project)
            exp = experiment.experiment_id if experiment else self.client.create_experiment(project)
            self.run_id = self.client.create_run(exp, run_name=name).info.run_id

    def _reopen(self, run_id: str | None) -> dict | None:
        """The params of run ``run_id``, set RUNNING again; None if there is no such live run
        (no id, another tracking store, a deleted run)."""
        from mlflow.exceptions import MlflowException

        if not run_id:
            return None
        try:
            run = self.client.get_run(run_id)
        except MlflowException:
            return None
        if run.info.lifecycle_stage != "active":
            return None
        self.run_id = run_id
        self.client.update_run(run_id, status="RUNNING")
        return dict(run.data.params)

    def log(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        batch = [self._metric(mlflow_name(k), v, now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def log_config(self, config: dict) -> None:
        """Params; a reopened run's keep their first values (MLflow refuses a change), and a
        changed one goes to the tag ``config_changed/<key>``."""
        old = self._old_params or {}
        flat = {k: str(v) for k, v in sorted(flatten(config, ".").items())}
        params = [self._param(k, v) for k, v in flat.items() if k not in old]
        tags = [self._tag(f"config_changed/{k}", v) for k, v in flat.items() if old.get(k, v) != v]
        n = self._PARAMS_PER_CALL
        for i in range(0, len(params), n):
            self.client.log_batch(self.run_id, params=params[i : i + n])
        for i in range(0, len(tags), n):
            self.client.log_batch(self.run_id, tags=tags[i : i + n])

    def log_summary(self, summary: dict[str, float], step: int) -> None:
        self.log({f"summary/{k}": v for k, v in summary.items()}, step)

    def log_samples(self, samples: list[dict], version: int, step: int) -> None:
        """The artifact ``val_samples/v<version>.json`` in the layout of ``mlflow.log_table``
        (``{"columns", "data"}``, without its pandas dependency); a version validated again
        (a restarted learner) replaces its file."""
        table = {"columns": list(SAMPLE_COLUMNS), "data": sample_rows(samples, version)}
        self.client.log_dict(self.run_id, table, f"val_samples/v{version:06d}.json")

    def close(self, status: str = "FINISHED") -> None:
        exit_code(status)  # checked: one of CLOSE_STATUSES, which are MLflow's own names
        self.client.set_terminated(self.run_id, status=status)
