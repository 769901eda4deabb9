"""The adapters alone, in PEFT's format: a directory that ``peft.PeftModel.from_pretrained``
and vLLM's ``LoRARequest`` load on top of the base model.

    adapter/adapter_model.safetensors   base_model.model.<layer>.lora_A.weight [r, in],
                                        base_model.model.<layer>.lora_B.weight [out, r]
    adapter/adapter_config.json         peft's LoraConfig: r, lora_alpha, the adapted modules

Written beside a checkpoint's merged ``hf/`` export (learner/state/checkpoint.py). The
tensors are the adapters as trained (float32), a few MB where the merged model is hundreds.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from asyncrl.core.config.learner import LoraConfig
from asyncrl.learner.lora.adapters import ADAPTER, adapted_layers
from asyncrl.learner.lora.merge import LORA_A, LORA_B

PEFT_PREFIX = "base_model.model."
"""What peft puts before a module's name in a saved adapter."""
FILES = ("adapter_model.safetensors", "adapter_config.json")


def lora_config_of(model: nn.Module) -> LoraConfig | None:
    """The ``model.lora`` settings the adapters of ``model`` were made with (None: none)."""
    layers = adapted_layers(model)
    if not layers:
        return None
    _, layer = layers[0]
    get = lambda attr: getattr(layer, attr)[ADAPTER]  # noqa: E731 (peft's per-adapter dicts)
    dropout = get("lora_dropout")
    return LoraConfig(
        rank=int(get("r")), alpha=float(get("lora_alpha")),
        dropout=float(getattr(dropout, "p", 0.0)), targets=sorted({n.rsplit(".", 1)[-1] for n, _ in layers}),
    )  # fmt: skip


def adapter_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """``{PEFT name: tensor}`` of the LoRA tensors of ``named`` (an adapted model's full state
    dict): ``X.lora_A.default.weight`` -> ``base_model.model.X.lora_A.weight``."""
    out = {}
    for name, tensor in named:
        for suffix, short in ((LORA_A, ".lora_A.weight"), (LORA_B, ".lora_B.weight")):
            if name.endswith(suffix):
                out[PEFT_PREFIX + name[: -len(suffix)] + short] = tensor
    return out


def adapted_modules(tensors: dict[str, torch.Tensor]) -> list[str]:
    """The suffixes (``q_proj``, ``down_proj``) of the modules ``tensors`` adapt, sorted."""
    return sorted({n.rsplit(".lora_", 1)[0].rsplit(".", 1)[-1] for n in tensors})


def write_adapter(
    out_dir: Path, tensors: dict[str, torch.Tensor], lora: LoraConfig, base_model: str
) -> None:
    """Write ``tensors`` (``adapter_tensors``) and their config into ``out_dir``. The config
    names the adapted modules explicitly (not ``all-linear``, which vLLM does not expand)."""
    from peft import LoraConfig as PeftLoraConfig
    from safetensors.torch import save_file

    if not tensors:
        raise ValueError("no LoRA tensors to write: the model has no adapters")
    out_dir.mkdir(parents=True, exist_ok=True)
    plain = {n: t.detach().cpu().contiguous() for n, t in tensors.items()}
    save_file(plain, str(out_dir / FILES[0]), metadata={"format": "pt"})
    alpha: object = lora.alpha  # peft annotates an int; its scale is alpha / r for any number
    config = PeftLoraConfig(
        r=lora.rank, lora_alpha=alpha, lora_dropout=lora.dropout,  # type: ignore[arg-type]
        target_modules=adapted_modules(tensors), bias="none", task_type="CAUSAL_LM",
        base_model_name_or_path=base_model,
    )  # fmt: skip
    config.save_pretrained(str(out_dir))
