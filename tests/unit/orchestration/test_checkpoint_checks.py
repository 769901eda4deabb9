"""The learner's checkpoint inputs, checked before any process starts
(asyncrl/orchestration/launch/checkpoint_checks.py; issue 43 round 4): a read-only
checkpoint directory, ``learner.resume_from`` of another model's shape, and a
``resume_from`` that a run directory's own checkpoints override."""

from __future__ import annotations

import json
import os

import pytest

from asyncrl.core.config.load import load_config
from asyncrl.core.runtime.fatal import FatalError
from asyncrl.orchestration.launch.checkpoint_checks import check_resume_from, check_writable

SHAPE = {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 32}


def _model(path, **changes):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({**SHAPE, **changes}))
    return path


def _checkpoint(run, version=6, **changes):
    step = run / "checkpoints" / f"step_{version:06d}"
    (step / "dcp").mkdir(parents=True)
    (step / "COMPLETE").write_text(str(version))
    _model(step / "hf", **changes)
    return step


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through read-only modes")
def test_a_read_only_checkpoint_dir_is_refused_naming_the_key(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        cfg = load_config([f"run_dir={tmp_path / 'run'}", f"learner.checkpoint_dir={ro}"])
        with pytest.raises(
            FatalError, match=r"checkpoints cannot be written to .*learner\.checkpoint_dir"
        ):
            check_writable(cfg)
    finally:
        ro.chmod(0o700)


def test_a_checkpoint_dir_under_a_file_is_refused_naming_the_key(tmp_path):
    """The same check where root cannot write either: the path lies under a file."""
    (tmp_path / "file").write_text("x")
    cfg = load_config(
        [f"run_dir={tmp_path / 'run'}", f"learner.checkpoint_dir={tmp_path / 'file'}"]
    )
    with pytest.raises(FatalError) as e:
        check_writable(cfg)
    assert "the learner would fail at its first checkpoint" in str(e.value)
    assert "Give learner.checkpoint_dir a directory" in str(e.value)
    check_writable(load_config([f"run_dir={tmp_path / 'run'}"]))  # the run dir: fine


def test_resume_from_another_models_checkpoint_is_refused_naming_both(tmp_path):
    model = _model(tmp_path / "model")
    theirs = _checkpoint(tmp_path / "other", hidden_size=128, num_hidden_layers=4)
    cfg = load_config([f"run_dir={tmp_path / 'run'}", f"learner.resume_from={theirs}"])
    with pytest.raises(FatalError) as e:
        check_resume_from(cfg, str(model))
    text = str(e.value)
    assert f"learner.resume_from={theirs} was trained from another model than model.path" in text
    assert "hidden_size 128 vs 64, num_hidden_layers 4 vs 2 (checkpoint vs model.path)" in text
    same = _checkpoint(tmp_path / "same")
    check_resume_from(
        load_config([f"run_dir={tmp_path / 'r2'}", f"learner.resume_from={same}"]), str(model)
    )


def test_resume_from_is_said_to_be_unused_when_the_run_has_checkpoints_of_its_own(tmp_path):
    model = _model(tmp_path / "model")
    theirs = _checkpoint(tmp_path / "other", hidden_size=128)  # would be refused if used
    own = _checkpoint(tmp_path / "run", version=3)
    said: list[str] = []
    cfg = load_config([f"run_dir={tmp_path / 'run'}", f"learner.resume_from={theirs}"])
    check_resume_from(cfg, str(model), said.append)
    assert len(said) == 1 and f"learner.resume_from={theirs} is not used" in said[0]
    assert str(own) in said[0] and "give a new run_dir" in said[0]
