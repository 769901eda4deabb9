"""Atomic checkpoints: DCP (sharded, for resume) + an HF safetensors export + state.json.

Layout: ``<run_dir>/checkpoints/step_<V>/{dcp/, hf/, state.json, COMPLETE}``. A checkpoint is
written under ``.tmp-step_<V>`` and renamed only after every file is on disk and the
``COMPLETE`` marker is written, so resume never sees a partial checkpoint. Only after that
are the trained groups acknowledged in the buffer (ack-on-checkpoint).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from learner.model import full_named_tensors

_MARKER = "COMPLETE"
_WEIGHT_FILES = {"model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"}


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """Newest complete checkpoint under ``run_dir/checkpoints`` (None if there is none)."""
    root = Path(run_dir) / "checkpoints"
    done = sorted(p for p in root.glob("step_*") if (p / _MARKER).is_file())
    return done[-1] if done else None


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save_checkpoint(
    run_dir: str | Path,
    version: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict,
    source_model_dir: str | Path,
    extra: dict[str, tuple[nn.Module, torch.optim.Optimizer]] | None = None,
) -> Path:
    """Collective: every rank calls it. Returns the final checkpoint directory.

    ``extra``: more (model, optimizer) pairs saved in the same DCP checkpoint under their
    name (e.g. ``{"critic": ...}``); only the policy is exported to ``hf/``."""
    import torch.distributed.checkpoint as dcp

    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{version:06d}"
    tmp = root / f".tmp-step_{version:06d}"
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    dcp.save(_state_dicts(model, optimizer, extra), checkpoint_id=str(tmp / "dcp"))
    export_hf(model, tmp / "hf", source_model_dir)
    if _rank() == 0:
        (tmp / "state.json").write_text(json.dumps(state, indent=2))
        _fsync_tree(tmp)
        (tmp / _MARKER).write_text(str(version))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    _barrier()
    return final


def export_hf(model: nn.Module, out_dir: Path, source_model_dir: str | Path) -> None:
    """Collective: write full weights as safetensors plus the source's config/tokenizer files."""
    from safetensors.torch import save_file

    tensors = {name: t.contiguous().clone() for name, t in full_named_tensors(model)}
    if _rank() != 0:
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in Path(source_model_dir).iterdir():
        if f.is_file() and f.name not in _WEIGHT_FILES:
            shutil.copy2(f, out_dir / f.name)
    # tied embeddings share storage; safetensors refuses shared tensors, HF re-ties on load
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def load_checkpoint(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, tuple[nn.Module, torch.optim.Optimizer]] | None = None,
) -> dict:
    """Collective: restore model and optimizer shards (and ``extra``'s); returns state.json."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    sd = _state_dicts(model, optimizer, extra)
    dcp.load(sd, checkpoint_id=str(path / "dcp"))
    pairs = {"": (model, optimizer), **{f"{k}_": v for k, v in (extra or {}).items()}}
    for prefix, (m, o) in pairs.items():
        set_state_dict(m, o, model_state_dict=sd[f"{prefix}model"],
                       optim_state_dict=sd[f"{prefix}optim"])  # fmt: skip
    return json.loads((path / "state.json").read_text())


def _state_dicts(model, optimizer, extra) -> dict:
    """``{"model", "optim"}`` for the policy and ``{"<name>_model", "<name>_optim"}`` per extra."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    pairs = {"": (model, optimizer), **{f"{k}_": v for k, v in (extra or {}).items()}}
    out = {}
    for prefix, (m, o) in pairs.items():
        out[f"{prefix}model"], out[f"{prefix}optim"] = get_state_dict(m, o)
    return out


def _fsync_tree(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
