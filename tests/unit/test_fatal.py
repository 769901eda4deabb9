"""``asyncrl.fatal``: which errors a restart cannot fix, and what a role records for its
launcher (the launcher's side: tests/unit/test_supervise.py)."""

from __future__ import annotations

import errno

import pytest

from asyncrl import fatal


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
