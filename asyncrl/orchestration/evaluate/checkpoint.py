"""``--checkpoint PATH``: the learner checkpoint an evaluation loads, found and checked.

A learner writes ``<root>/checkpoints/step_<V>/{dcp/, hf/, state.json, manifest.json,
COMPLETE}`` (asyncrl/learner/state/checkpoint.py; ``<root>`` is ``learner.checkpoint_dir`` or
the run directory); a LoRA run (``model.lora``) writes ``adapter/`` (PEFT's format) in place
of ``hf/``, which it adds only with ``model.lora.export_merged=true``. vLLM loads the ``hf/``
export when there is one, else the base model (the evaluation's ``model.path``) with the
``adapter/`` on it; ``V`` (the optimizer steps its weights had) labels the result. ``PATH``
may name:

==========================================  =============================================
``.../checkpoints/step_<V>``                that checkpoint
``.../checkpoints/step_<V>/hf`` (/adapter)  the same
a run directory, or its ``checkpoints/``    its newest complete checkpoint
==========================================  =============================================

A checkpoint is usable when it is complete (its ``COMPLETE`` marker says ``V``) and its
export is there and matches the manifest written with it; the adapters of a LoRA one only on
the base they were trained on (``check_lora_base``, against ``state.json``'s ``lora_base``).
A plain model directory is ``model=local model.path=DIR``, not a checkpoint.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from asyncrl.actors.engine.adapters import ADAPTER_FILE, CONFIG_FILE
from asyncrl.learner.lora.base import base_mismatch
from asyncrl.learner.state.checkpoint import (  # complete_version: what a complete one is
    complete_version,
    latest_checkpoint,
    verify_checkpoint,
)

_STEP = re.compile(r"step_[0-9]+")
_EXPORTS = ("hf", "adapter")
"""The folders of a checkpoint that vLLM loads: a merged model, or LoRA adapters."""
COMPARED_KEYS = ("task.name", "task.reward_fn", "data.val_files")
"""What a checkpoint's run and the evaluation should agree on (``run_config_warnings``)."""


@dataclass(frozen=True)
class Adapter:
    """A LoRA checkpoint's adapters (``adapter/``, learner/lora/peft_export.py), which vLLM
    loads on the base model as one ``LoRARequest``."""

    path: Path
    """``.../checkpoints/step_<V>/adapter``: ``adapter_config.json`` and the safetensors."""
    rank: int
    """``r`` of its ``adapter_config.json``: the engine's LoRA rank."""
    alpha: float
    """``lora_alpha`` of its ``adapter_config.json``."""


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint with its HF export, or with LoRA adapters alone."""

    path: Path
    """``.../checkpoints/step_<V>``, absolute."""
    version: int
    """``V``: the learner's optimizer steps when it was saved."""
    adapter: Adapter | None = None
    """Set when the checkpoint has no ``hf/`` but LoRA adapters: vLLM loads ``model.path``
    (the base, ``check_lora_base``) with these on it. None: ``hf/`` is the whole model."""

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
            ".../checkpoints/step_<V> (or its hf/ or adapter/), or a run directory (its newest "
            "checkpoint)"
        )
    if path.name in _EXPORTS and _STEP.fullmatch(path.parent.name):
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
    """``step`` as a ``Checkpoint``: complete, with an intact ``hf/`` (preferred) or
    ``adapter/``; ``ValueError``/``FileNotFoundError`` saying what is wrong otherwise."""
    version = complete_version(step)
    if version is None:
        raise ValueError(
            f"--checkpoint {text}: {step} is not a complete checkpoint (no COMPLETE marker "
            "saying its version: a save that was interrupted); give an earlier step_<V>, or "
            "the run directory for its newest complete checkpoint"
        )
    if (step / "hf" / "config.json").is_file():
        _check_intact(step, "HF export", verify_checkpoint(step, "hf/"), text)
        return Checkpoint(step, version)
    if (step / "adapter").is_dir():
        _check_intact(step, "LoRA adapter (adapter/)", _adapter_problem(step / "adapter"), text)
        return Checkpoint(step, version, read_adapter(step / "adapter"))
    raise FileNotFoundError(_no_export(step))


def _adapter_problem(adapter: Path) -> str | None:
    """What is wrong with the checkpoint's ``adapter/`` (a file missing, or not matching the
    manifest), or None."""
    for name in (CONFIG_FILE, ADAPTER_FILE):
        if not (adapter / name).is_file():
            return f"adapter/{name} is missing"
    return verify_checkpoint(adapter.parent, "adapter/")


def _check_intact(step: Path, what: str, problem: str | None, text: str) -> None:
    """Raise ``ValueError`` naming ``problem`` of ``step``'s ``what`` (its export), if any."""
    if problem is not None:
        raise ValueError(
            f"--checkpoint {text}: the {what} of {step} is damaged ({problem}); give "
            "another checkpoint of the run, or restore this one from a backup"
        )


def read_adapter(path: Path) -> Adapter:
    """The ``Adapter`` in ``path`` (its ``adapter_config.json``: ``r``, ``lora_alpha``)."""
    config = path / CONFIG_FILE
    try:
        data = json.loads(config.read_text())
        return Adapter(path, int(data["r"]), float(data["lora_alpha"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"{config} cannot be read as a PEFT LoRA config with r and lora_alpha ({e!r}); "
            "give another checkpoint of the run, or restore this one from a backup"
        ) from None


def _loadable(step: Path) -> bool:
    """Whether ``step`` is complete and has ``hf/`` or ``adapter/`` to load."""
    return complete_version(step) is not None and (
        (step / "hf" / "config.json").is_file() or (step / "adapter" / CONFIG_FILE).is_file()
    )


def _no_export(step: Path) -> str:
    """Why a checkpoint without ``hf/`` or ``adapter/`` cannot be evaluated, and what can be."""
    others = sorted(p.name for p in step.parent.glob("step_*") if p != step and _loadable(p))
    offer = (
        f"evaluate one that has it (--checkpoint {step.parent / others[-1]}; with an "
        f"export: {', '.join(others)})"
        if others
        else f"resume a run from it (learner.resume_from={step}): its next checkpoint has one"
    )
    return (
        f"checkpoint {step} has no HF export ({step / 'hf' / 'config.json'} is missing) and "
        f"no LoRA adapters ({step / 'adapter'} is missing): one of them is what asyncrl eval "
        "loads into vLLM (the dcp/ shards are for resuming training). A full fine-tuning "
        "run writes hf/ at every save, a LoRA run (model.lora) adapter/ (and the merged "
        "model as hf/ with model.lora.export_merged=true): this checkpoint lost its folder "
        f"(copied without it, or deleted). Copy it back, or {offer}"
    )


def check_lora_base(ckpt: Checkpoint, model_dir: str) -> None:
    """Refuse (``ValueError`` naming both directories and the fix) when ``model_dir``, the
    evaluation's ``model.path`` resolved, is not the base the adapters of ``ckpt`` were trained
    on (``state.json``'s ``lora_base``: asyncrl/learner/lora/base.py). A checkpoint that
    recorded no base is not checked."""
    saved = _state(ckpt.path).get("lora_base") or {}
    problem = base_mismatch(saved, model_dir)
    if problem is None:
        return
    run_config = ckpt.path.parent.parent / "config.json"
    where = f" (its config: {run_config})" if run_config.is_file() else ""
    raise ValueError(
        f"--checkpoint {ckpt.path} holds LoRA adapters alone, and they belong to another "
        f"base model than this evaluation's model.path ({model_dir}): {problem}. Give the "
        f"model.path or model preset the run trained from{where}, e.g. model=local "
        f"model.path={saved.get('path')} while that directory is unchanged"
    )


def _state(step: Path) -> dict:
    """``step/state.json`` ({} when there is none: a checkpoint from before it)."""
    path = step / "state.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ValueError(
            f"{path} cannot be read ({e}); restore the checkpoint from a backup"
        ) from None


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
