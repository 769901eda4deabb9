"""What a learner will write and resume, checked before any process starts (issue 43 round 4):

- ``learner.checkpoint_dir`` (or the run directory) must be writable: a read-only one was
  found only at the first checkpoint, after the run had trained up to it;
- ``learner.resume_from`` must be a complete checkpoint of the model ``model.path`` names: a
  checkpoint of another shape failed inside DCP's load with torch's ``Missing key`` and a
  ``restart_max`` hint;
- ``learner.resume_from`` is not used when the run directory has checkpoints of its own (they
  are resumed, as a restarted learner must): that is said, not silently ignored.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from asyncrl.core.config.job import Config
from asyncrl.core.runtime.fatal import FatalError

SHAPE_KEYS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
)
"""The ``config.json`` fields that decide whether a checkpoint's tensors fit a model."""


def checkpoint_root(cfg: Config) -> Path:
    """Where the learner writes ``checkpoints/step_<V>`` (as learner/trainer.py)."""
    return Path(cfg.learner.checkpoint_dir or cfg.run_dir)


def check_writable(cfg: Config) -> None:
    """``FatalError`` naming the directory and the key unless a file can be written there."""
    where = checkpoint_root(cfg) / "checkpoints"
    key = "learner.checkpoint_dir" if cfg.learner.checkpoint_dir else "run_dir"
    try:
        where.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=where, prefix=".write-test-"):
            pass
    except OSError as e:
        raise FatalError(
            f"checkpoints cannot be written to {where} ({e.strerror or e}); the learner would "
            f"fail at its first checkpoint. Give {key} a directory this user can write"
        ) from None


def shape(config_path: Path) -> dict:
    """The ``SHAPE_KEYS`` of a ``config.json`` (a multimodal one's ``text_config`` too)."""
    raw = json.loads(config_path.read_text())
    text = raw.get("text_config") or {}
    return {k: raw.get(k, text.get(k)) for k in SHAPE_KEYS if k in raw or k in text}


def check_resume_from(cfg: Config, model_dir: str, say=print) -> None:
    """``learner.resume_from`` against this run and ``model_dir`` (module docstring)."""
    from asyncrl.learner.state.complete import latest_checkpoint  # no torch in the launcher

    path_text = cfg.learner.resume_from
    if not path_text:
        return
    own = latest_checkpoint(checkpoint_root(cfg))
    if own is not None:
        say(
            f"[asyncrl] learner.resume_from={path_text} is not used: this run has checkpoints "
            f"of its own ({own}), and a run directory's own checkpoints are always resumed "
            "(a restarted learner must continue its run). To start from that checkpoint, "
            "give a new run_dir"
        )
        return
    path = Path(path_text).expanduser()
    if not (path / "COMPLETE").is_file() or not (path / "dcp").is_dir():
        raise FatalError(
            f"learner.resume_from={path_text}: not a complete checkpoint (no COMPLETE marker "
            "or dcp/ there); give a directory .../checkpoints/step_<V> of a finished save"
        )
    theirs_file = path / "hf" / "config.json"
    if not theirs_file.is_file():
        return  # a checkpoint without its export: DCP's load checks the keys
    theirs, ours = shape(theirs_file), shape(Path(model_dir) / "config.json")
    differ = {k: (theirs.get(k), ours.get(k)) for k in SHAPE_KEYS if theirs.get(k) != ours.get(k)}
    if differ:
        shown = ", ".join(f"{k} {a} vs {b}" for k, (a, b) in differ.items())
        raise FatalError(
            f"learner.resume_from={path_text} was trained from another model than model.path="
            f"{cfg.model.path} ({model_dir}): {shown} (checkpoint vs model.path). Give the "
            "model.path that run trained, or a checkpoint of this model"
        )


def check_learner_start(cfg: Config, model_dir: str, say=print) -> None:
    """Every check of this module, for a launch that runs a learner."""
    check_writable(cfg)
    check_resume_from(cfg, model_dir, say)
