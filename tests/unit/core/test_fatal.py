"""``asyncrl.core.runtime.fatal``: which errors a restart cannot fix, and what a role records for its
launcher (the launcher's side: tests/unit/orchestration/test_supervise.py)."""

from __future__ import annotations

import errno

import pytest

from asyncrl.core.runtime import fatal


@pytest.mark.parametrize(
    ("error", "fatal_"),
    [
        (fatal.FatalError("bad model"), True),
        (OSError(errno.ENOSPC, "No space left on device", "/ckpt/step_2/x"), True),
        (OSError(errno.EROFS, "Read-only file system", "/ckpt"), True),
        (OSError(errno.ECONNRESET, "Connection reset"), False),
        (RuntimeError("a crash a restart may fix"), False),
    ],
)
def test_is_fatal(error, fatal_):
    assert fatal.is_fatal(error) is fatal_


def test_a_full_disk_is_recorded_plainly_and_other_errors_are_not(tmp_path):
    full = OSError(errno.ENOSPC, "No space left on device", "/ckpt/step_2/model.safetensors")
    with pytest.raises(OSError), fatal.recorded(tmp_path, "learner"):
        raise full
    assert fatal.read(tmp_path, "learner") == (
        "no space left on the device of /ckpt/step_2/model.safetensors"
    )
    fatal.clear(tmp_path, "learner")
    with pytest.raises(RuntimeError), fatal.recorded(tmp_path, "learner"):
        raise RuntimeError("restartable")
    assert fatal.read(tmp_path, "learner") is None


def test_a_data_error_is_fatal_and_still_a_value_error(tmp_path):
    """Bad data found by an actor at start fails the same way after a restart: it is recorded
    for the launcher (which then does not restart the actor), and callers that catch it as a
    ``ValueError`` still do."""
    from asyncrl.actors.data.datafile import DataError

    error = DataError("data.train_files: 'x.csv' has an unknown format '.csv'; give parquet")
    assert fatal.is_fatal(error) and isinstance(error, ValueError)
    with pytest.raises(ValueError), fatal.recorded(tmp_path, "actor0"):
        raise error
    assert fatal.read(tmp_path, "actor0") == str(error)


def test_an_actor_that_finds_bad_data_at_start_records_it(tmp_path, monkeypatch):
    """The actor entry point: a missing data file is recorded in ``fatal-actor0.txt`` (the
    data is read before the buffer is reached: the URL here leads nowhere)."""
    from asyncrl.actors.main import main
    from asyncrl.core.config.load import config_to_json, load_config

    missing = tmp_path / "missing.jsonl"
    cfg = load_config(["task=file", f"data.train_files=[{missing}]", f"run_dir={tmp_path}"])
    (tmp_path / "config.json").write_text(config_to_json(cfg))
    monkeypatch.setenv("ASYNCRL_REDIS_URL", "redis://127.0.0.1:1/0")
    with pytest.raises(ValueError, match="does not exist"):
        main(["--run-dir", str(tmp_path), "--model-dir", str(tmp_path), "--actor-id", "0"])
    assert "missing.jsonl' does not exist" in fatal.read(tmp_path, "actor0")
