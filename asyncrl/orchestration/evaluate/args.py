"""What ``asyncrl eval`` adds to the command line of ``asyncrl run`` (pure; no heavy imports).

The overrides compose the same Hydra config as ``asyncrl run``. One difference: a ``file``
task needs ``data.train_files`` to compose, and an evaluation reads none, so unless the
command line names ``data.train_files`` they default to ``data.val_files`` (an
interpolation: a preset's or the command line's val files alike). Evaluation never reads
them.
"""

from __future__ import annotations

import time

VAL_AS_TRAIN = "data.train_files=${data.val_files}"
"""Appended to the overrides unless they set ``data.train_files`` themselves."""
OUTPUT_NAME = "eval.json"
"""The result file's name in the run directory (``--output`` names another file)."""
_TRAIN_FILES_MISSING = "task.name=file needs data.train_files"
"""The config's error for a file task with no data (asyncrl/core/config/job.py)."""


def eval_overrides(overrides: list[str]) -> list[str]:
    """``overrides`` plus ``VAL_AS_TRAIN`` unless one of them sets ``data.train_files``."""
    keys = {o.partition("=")[0].lstrip("+~") for o in overrides}
    return list(overrides) if "data.train_files" in keys else [*overrides, VAL_AS_TRAIN]


def explain_config_error(message: str) -> str:
    """The config's error in an evaluation's words: a file task's missing data is its
    validation files (they stood in for the train files, and were empty too)."""
    if _TRAIN_FILES_MISSING in message:
        return (
            "asyncrl eval scores data.val_files, which is empty: give "
            "data.val_files=[path.parquet,...] (.parquet or .jsonl) with task=file"
        )
    return message


def default_run_dir(run_dir: str, now: float | None = None) -> str:
    """``run_dir`` when set, else ``runs/eval-<local time>`` (``asyncrl run`` makes
    ``runs/<local time>``)."""
    return run_dir or time.strftime("runs/eval-%Y%m%d-%H%M%S", time.localtime(now))
