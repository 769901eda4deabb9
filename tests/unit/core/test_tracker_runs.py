"""How tracker runs end and continue (asyncrl/core/observe/trackers.py): a crashed learner's runs end
FAILED (MLflow status, W&B exit code 1), not RUNNING forever; a restarted learner in the same
run_dir writes into the same MLflow run and W&B run id (``<run_dir>/trackers.json``). Each
is read back from what the real library wrote (tests/readback.py)."""

from __future__ import annotations

import json
import os

import pytest

from asyncrl.core.config.load import load_config
from asyncrl.core.observe import trackers
from asyncrl.learner.hub.null import NullHub
from asyncrl.learner.hub.runlog import RunLog
from asyncrl.learner.main import tracker_runs_failed_on_error
from tests import readback


@pytest.fixture(autouse=True)
def _restore_environ(monkeypatch):
    """The trackers set defaults in os.environ (WANDB_SILENT, MLFLOW_ALLOW_FILE_STORE, ...)."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


class FakeHub:
    """What ``tracker_runs_failed_on_error`` uses of ``asyncrl.learner.hub.hub.Hub``: ``close_log``."""

    def __init__(self, log: RunLog) -> None:
        self.log = log

    def close_log(self, status: str) -> None:
        self.log.close(status)


def _open(run_dir, *overrides) -> RunLog:
    cfg = load_config(["logger=[tensorboard,wandb,mlflow]", "project_name=proj",
                       f"run_dir={run_dir}", *overrides])  # fmt: skip
    return RunLog(run_dir, quiet=True, trackers=trackers.open_trackers(cfg, run_dir))


def _step(log: RunLog, step: int) -> None:
    log.log({"step": step, "version": step + 1, "reward": 0.5, "loss": 1.0 / (step + 1)})


def test_a_crash_ends_the_runs_failed_and_a_restart_continues_them(tmp_path):
    for lib in ("tensorboard", "wandb", "mlflow"):
        pytest.importorskip(lib, reason=f"pip install 'asyncrl[{lib}]' (make test does)")
    log = _open(tmp_path, "learner.steps=4")
    _step(log, 0)
    with pytest.raises(RuntimeError, match="boom"), tracker_runs_failed_on_error(FakeHub(log)):
        raise RuntimeError("boom")
    ids = json.loads((tmp_path / "trackers.json").read_text())
    assert set(ids) == {"wandb", "mlflow"}
    (run,) = readback.mlflow_runs(tmp_path / "mlruns")
    assert (run.info.run_id, run.info.status) == (ids["mlflow"], "FAILED")
    (crashed,) = readback.wandb_offline_runs(tmp_path / "wandb")
    assert crashed == {"id": ids["wandb"], "steps": [0], "exit_code": 1}

    # the launcher restarts the learner (here with a changed config, as a resume may have)
    log = _open(tmp_path, "learner.steps=9")
    (run,) = readback.mlflow_runs(tmp_path / "mlruns")
    assert (run.info.run_id, run.info.status) == (ids["mlflow"], "RUNNING")
    _step(log, 1)
    log.close()
    log.close()  # a second close does nothing
    assert json.loads((tmp_path / "trackers.json").read_text()) == ids
    (run,) = readback.mlflow_runs(tmp_path / "mlruns")
    assert (run.info.run_id, run.info.status) == (ids["mlflow"], "FINISHED")
    history = readback.mlflow_history(tmp_path / "mlruns", run.info.run_id, "train/loss")
    assert history == [(0, 1.0), (1, 0.5)]
    # MLflow params are immutable: the first value stays, the change is a tag
    assert run.data.params["learner.steps"] == "4"
    assert run.data.tags["config_changed/learner.steps"] == "9"
    runs = readback.wandb_offline_runs(tmp_path / "wandb")
    assert runs[1] == {"id": ids["wandb"], "steps": [1], "exit_code": 0}
    scalars = readback.tensorboard_scalars(tmp_path / "tensorboard")
    assert scalars["train/loss"] == [(0, 1.0), (1, 0.5)]


def test_a_stop_before_training_ends_the_mlflow_run_killed(tmp_path):
    pytest.importorskip("mlflow", reason="pip install 'asyncrl[mlflow]' (make test does)")
    tracker = trackers.MlflowTracker(tmp_path, "proj", "exp1")
    tracker.close("KILLED")
    (run,) = readback.mlflow_runs(tmp_path / "mlruns")
    assert run.info.status == "KILLED"
    with pytest.raises(ValueError, match="'DONE'; one of FINISHED, FAILED, KILLED"):
        trackers.exit_code("DONE")


class Tracker:
    def __init__(self, fail: bool = False) -> None:
        self.fail, self.status = fail, None

    def log(self, metrics, step):
        pass

    def close(self, status="FINISHED"):
        self.status = status
        if self.fail:
            raise OSError("disk full")


def test_every_tracker_is_closed_even_if_one_fails(tmp_path, capsys):
    a, b = Tracker(fail=True), Tracker()
    log = RunLog(tmp_path, quiet=True, trackers=[a, b])
    with pytest.raises(KeyError), tracker_runs_failed_on_error(FakeHub(log)):
        raise KeyError("the crash")  # the crash propagates, not the tracker's error
    assert (a.status, b.status) == ("FAILED", "FAILED")
    assert "closing the experiment trackers failed: OSError('disk full')" in capsys.readouterr().out
    with pytest.raises(KeyError), tracker_runs_failed_on_error(NullHub()):  # ranks other than 0
        raise KeyError("the crash")


def test_unreadable_run_ids_open_new_runs(tmp_path):
    (tmp_path / "trackers.json").write_text("{not json")
    assert trackers.read_run_ids(tmp_path) == {}
    (tmp_path / "trackers.json").write_text('{"wandb": "abc", "mlflow": 3}')
    assert trackers.read_run_ids(tmp_path) == {"wandb": "abc"}
