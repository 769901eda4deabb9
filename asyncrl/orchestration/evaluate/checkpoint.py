"""``--checkpoint PATH``: the learner checkpoint an evaluation loads, found and checked.

A learner writes ``<root>/checkpoints/step_<V>/{dcp/, hf/, state.json, manifest.json,
COMPLETE}`` (asyncrl/learner/state/checkpoint.py; ``<root>`` is ``learner.checkpoint_dir`` or
the run directory). vLLM loads the ``hf/`` export; ``V`` (the optimizer steps its weights
had) labels the result. ``PATH`` may name:

==========================================  =============================================
``.../checkpoints/step_<V>``                that checkpoint
``.../checkpoints/step_<V>/hf``             the same
a run directory, or its ``checkpoints/``    its newest complete checkpoint
==========================================  =============================================

A checkpoint is usable when it is complete (its ``COMPLETE`` marker says ``V``) and its
export is there and matches the manifest written with it. A plain model directory is
``model=local model.path=DIR``, not a checkpoint.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from asyncrl.learner.state.checkpoint import (  # complete_version: what a complete one is
    complete_version,
    latest_checkpoint,
    verify_checkpoint,
)

_STEP = re.compile(r"step_[0-9]+")
COMPARED_KEYS = ("task.name", "task.reward_fn", "data.val_files")
"""What a checkpoint's run and the evaluation should agree on (``run_config_warnings``)."""


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint with its HF export."""

    path: Path
    """``.../checkpoints/step_<V>``, absolute."""
    version: int
    """``V``: the learner's optimizer steps when it was saved."""

    @property
    def hf(self) -> Path:
        """The HF export vLLM loads (config, safetensors, tokenizer)."""
        return self.path / "hf"


def find_checkpoint(text: str) -> Checkpoint:
    """The checkpoint ``text`` names (module docstring); ``FileNotFoundError`` or
    ``ValueError`` naming the path and the fix when it names none that can be loaded."""
    path = Path(text).expanduser().absolute()
    if not path.exists():
        raise FileNotFoundError(
            f"--checkpoint {text}: no such file or directory; give a checkpoint directory "
            ".../checkpoints/step_<V> (or its hf/), or a run directory (its newest checkpoint)"
        )
    if path.name == "hf" and _STEP.fullmatch(path.parent.name):
        path = path.parent
    if _STEP.fullmatch(path.name):
        return _checked(path, text)
    root = path.parent if path.name == "checkpoints" else path
    if not (root / "checkpoints").is_dir():
        raise FileNotFoundError(
            f"--checkpoint {text}: not a checkpoint (.../checkpoints/step_<V>), its hf/ export "
            "or a run directory with checkpoints/; a model directory is evaluated with "
            "model=local model.path=DIR"
        )
    newest = latest_checkpoint(root)
    if newest is None:
        raise FileNotFoundError(
            f"--checkpoint {text}: no complete checkpoint under {root / 'checkpoints'} (the "
            "run has not finished a save yet: learner.checkpoint_every)"
        )
    return _checked(newest, text)


def _checked(step: Path, text: str) -> Checkpoint:
    version = complete_version(step)
    if version is None:
        raise ValueError(
            f"--checkpoint {text}: {step} is not a complete checkpoint (no COMPLETE marker "
            "saying its version: a save that was interrupted); give an earlier step_<V>, or "
            "the run directory for its newest complete checkpoint"
        )
    ckpt = Checkpoint(step, version)
    if not (ckpt.hf / "config.json").is_file():
        raise FileNotFoundError(_no_export(step))
    problem = verify_checkpoint(step, "hf/")
    if problem is not None:
        raise ValueError(
            f"--checkpoint {text}: the HF export of {step} is damaged ({problem}); give "
            "another checkpoint of the run, or restore this one from a backup"
        )
    return ckpt


def _no_export(step: Path) -> str:
    """Why a checkpoint without ``hf/`` cannot be evaluated, and what can be."""
    others = sorted(
        p.name
        for p in step.parent.glob("step_*")
        if p != step and complete_version(p) is not None and (p / "hf" / "config.json").is_file()
    )
    offer = (
        f"evaluate one that has it (--checkpoint {step.parent / others[-1]}; with an "
        f"export: {', '.join(others)})"
        if others
        else f"resume a run from it (learner.resume_from={step}): its next checkpoint has one"
    )
    return (
        f"checkpoint {step} has no HF export ({step / 'hf' / 'config.json'} is missing), "
        "which is what asyncrl eval loads into vLLM (the dcp/ shards are for resuming "
        "training). Every save writes one: this checkpoint lost its hf/ folder (copied "
        f"without it, or deleted). Copy hf/ back, or {offer}"
    )


def run_config_warnings(ckpt: Checkpoint, cfg) -> list[str]:
    """The ``COMPARED_KEYS`` on which the checkpoint's run (its ``config.json`` beside
    ``checkpoints/``, when there is one) and this evaluation's config differ: the evaluation
    takes its task, data and reward from its own command line, not from the run."""
    path = ckpt.path.parent.parent / "config.json"
    try:
        theirs = json.loads(path.read_text())
    except (OSError, ValueError):
        return []  # learner.checkpoint_dir, or a run from elsewhere: nothing to compare
    out = []
    for key in COMPARED_KEYS:
        group, _, name = key.partition(".")
        mine, run = getattr(getattr(cfg, group), name), theirs.get(group, {}).get(name)
        if run is not None and run != mine:
            out.append(
                f"the checkpoint's run ({path}) has {key}={run}, this evaluation {key}={mine}: "
                "asyncrl eval takes the task, data and reward from its own command line; "
                f"give {key}=... to score as the run did"
            )
    return out
