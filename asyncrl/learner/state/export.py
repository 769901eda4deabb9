"""A checkpoint's exports (learner/state/checkpoint.py writes them beside dcp/): ``hf/``, the
policy as an ordinary Hugging Face directory (safetensors shards, the source's config and
tokenizer), and with LoRA ``adapter/``, the adapters alone in PEFT's format. Both are
collective: every rank takes part in each tensor's gather, rank 0 writes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from asyncrl.learner.compute.model import full_named_tensors

_WEIGHT_FILES = {
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
}


SHARD_BYTES = 4 << 30
"""Largest safetensors file of an HF export (a tensor larger than this is a shard alone)."""


def export_adapter(model: nn.Module, out_dir: Path, source_model_dir: str | Path) -> bool:
    """With LoRA adapters (``model.lora``), write them alone in PEFT's format into ``out_dir``
    (asyncrl/learner/lora/peft_export.py), for ``peft`` and vLLM's ``LoRARequest``; returns
    whether it wrote. Collective (the adapters are gathered on every rank, written by rank 0)."""
    from asyncrl.learner.compute.model import state_tensors
    from asyncrl.learner.lora.peft_export import adapter_tensors, lora_config_of, write_adapter

    lora = lora_config_of(model)
    if lora is None:
        return False
    tensors = adapter_tensors(state_tensors(model, only=lambda name: ".lora_" in name))
    if rank() == 0:
        write_adapter(out_dir, tensors, lora, str(source_model_dir))
    return True


def export_hf(
    model: nn.Module,
    out_dir: Path,
    source_model_dir: str | Path,
    dtype: torch.dtype | None = None,
    shard_bytes: int | None = None,
) -> None:
    """Collective: write the full weights as safetensors plus the source's config/tokenizer
    files, in ``dtype`` (the training dtype; floating tensors only; None keeps float32).

    Shard by shard: every rank takes part in each tensor's gather, but only rank 0
    keeps it, and only until its shard (at most ``shard_bytes``) is written, so no rank holds
    a host copy of the whole model (``shard_bytes``: default ``SHARD_BYTES``). One shard is
    ``model.safetensors``; several are ``model-0000i-of-0000N.safetensors`` with
    ``model.safetensors.index.json``, as ``save_pretrained`` writes them. ``config.json`` says
    the export's dtype."""
    from safetensors.torch import save_file

    shard_bytes = shard_bytes or SHARD_BYTES
    rank0 = rank() == 0
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    shards: list[list[str]] = []
    shard: dict[str, torch.Tensor] = {}
    size = 0

    def flush() -> None:
        nonlocal shard, size
        if shard:
            save_file(shard, str(out_dir / f".shard-{len(shards)}"), metadata={"format": "pt"})
            shards.append(list(shard))
        shard, size = {}, 0

    if rank0:
        out_dir.mkdir(parents=True, exist_ok=True)
    for name, t in full_named_tensors(model):
        if not rank0 or (tied and name == "lm_head.weight"):
            continue  # tied: safetensors refuses shared storage; HF re-ties on load
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        t = t.cpu().contiguous().clone()
        if shard and size + t.numel() * t.element_size() > shard_bytes:
            flush()
        shard[name] = t
        size += t.numel() * t.element_size()
    if not rank0:
        return
    flush()
    _name_shards(out_dir, shards)
    for f in Path(source_model_dir).iterdir():
        if f.is_file() and not _is_weights(f.name):
            shutil.copy2(f, out_dir / f.name)
    if dtype is not None:
        _set_config_dtype(out_dir / "config.json", dtype)


def _is_weights(name: str) -> bool:
    """A weight file (or its index) of a model directory, in any of HF's namings."""
    return name in _WEIGHT_FILES or name.endswith((".safetensors", ".bin", ".index.json"))


def _name_shards(out_dir: Path, shards: list[list[str]]) -> None:
    """Rename the written shards as ``save_pretrained`` names them (and write its index)."""
    if len(shards) == 1:
        os.replace(out_dir / ".shard-0", out_dir / "model.safetensors")
        return
    n, total = len(shards), 0
    weight_map: dict[str, str] = {}
    for i, names in enumerate(shards):
        final = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        total += (out_dir / f".shard-{i}").stat().st_size
        os.replace(out_dir / f".shard-{i}", out_dir / final)
        weight_map |= dict.fromkeys(names, final)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _set_config_dtype(config: Path, dtype: torch.dtype) -> None:
    """``config.json``'s dtype fields say what the export holds (transformers and vLLM load
    ``dtype="auto"`` from them)."""
    if not config.is_file():
        return
    data = json.loads(config.read_text())
    name = str(dtype).removeprefix("torch.")
    for key in ("torch_dtype", "dtype"):
        if key in data or key == "torch_dtype":
            data[key] = name
    config.write_text(json.dumps(data, indent=2) + "\n")


def rank() -> int:
    """This process's rank (0 outside a process group)."""
    return dist.get_rank() if dist.is_initialized() else 0
