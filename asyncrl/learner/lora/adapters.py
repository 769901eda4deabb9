"""Add LoRA adapters to a loaded Hugging Face model, in place (peft's ``inject_adapter_in_model``).

The model keeps its own class and names (no ``PeftModel`` wrapper), so everything that walks
it (``decoder_layers``, FSDP2's ``fully_shard`` per layer, gradient checkpointing, the
log-prob head) works unchanged. Each targeted ``nn.Linear`` ``X`` becomes a peft LoRA layer:
its weight moves to ``X.base_layer.weight`` (frozen), and ``X.lora_A.default.weight``
``[r, in]`` and ``X.lora_B.default.weight`` ``[out, r]`` (zero at start, so the adapted model
starts equal to the base) are the only trainable parameters. Forward:
``base(x) + alpha / r * B(A(dropout(x)))``.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import torch
from torch import nn

from asyncrl.core.config.learner import LORA_TARGETS_ALL, LoraConfig

ADAPTER = "default"
"""peft's adapter name: parameters ``*.lora_A.default.weight`` / ``*.lora_B.default.weight``."""


def add_adapters(model: nn.Module, lora: LoraConfig, seed: int = 0) -> nn.Module:
    """``model`` with adapters on ``lora.targets``, every other parameter frozen; returns it.
    The adapters start at ``initial_adapter(name, shape, seed)`` (a model on the meta device,
    to be sharded and loaded, gets them after: ``initial_adapter`` is per name, so every rank
    computes the same values for its shard).

    ValueError naming ``model.lora.targets`` when no linear layer matches, or when a target is
    not an ``nn.Linear`` (embeddings and convolutions would need other merge rules)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import inject_adapter_in_model

    targets = list(lora.targets)
    spec = LORA_TARGETS_ALL if targets == [LORA_TARGETS_ALL] else targets
    alpha: Any = lora.alpha  # peft annotates an int; its scale is alpha / r for any number
    config = PeftLoraConfig(
        r=lora.rank, lora_alpha=alpha, lora_dropout=lora.dropout, target_modules=spec, bias="none"
    )
    try:
        inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    except ValueError as e:
        raise ValueError(_no_match(model, targets, e)) from None
    _check_linear_only(model, targets)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.requires_grad_(".lora_" in name)
            if ".lora_" in name and not p.is_meta:
                p.copy_(initial_adapter(name, tuple(p.shape), seed))
    return model


def initial_adapter(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The starting value of adapter parameter ``name`` (float32, CPU): ``lora_B`` zero, so the
    adapted model starts equal to the base; ``lora_A`` uniform in ``+-1/sqrt(in)`` (peft's
    ``kaiming_uniform_(a=sqrt(5))``), drawn from a generator seeded by ``seed`` and ``name``
    alone: the same on every rank and in every load path, whatever the build order."""
    if ".lora_B." in name:
        return torch.zeros(shape)
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    bound = 1.0 / math.sqrt(shape[-1])
    return torch.empty(shape).uniform_(-bound, bound, generator=g)


def base_name(name: str) -> str | None:
    """The base checkpoint's name of the adapted model's state-dict entry ``name``
    (``X.base_layer.weight`` -> ``X.weight``); None for an adapter (in no base checkpoint)."""
    if ".lora_" in name:
        return None
    return name.replace(".base_layer.", ".")


def adapted_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every LoRA layer of ``model`` (empty: no adapters)."""
    return [
        (n, m)
        for n, m in model.named_modules()
        if hasattr(m, "lora_A") and hasattr(m, "base_layer")
    ]


def lora_scale(model: nn.Module) -> float | None:
    """The adapters' scale ``alpha / r`` (one for every layer), None without adapters."""
    layers = adapted_layers(model)
    if not layers:
        return None
    scaling: dict[str, float] = getattr(layers[0][1], "scaling")  # noqa: B009 (peft's attribute)
    return float(scaling[ADAPTER])


def trainable_count(model: nn.Module) -> tuple[int, int]:
    """(trainable parameters, all parameters) of ``model``, local shards under FSDP2."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def _check_linear_only(model: nn.Module, targets: list[str]) -> None:
    bad = [n for n, m in adapted_layers(model) if not isinstance(m.base_layer, nn.Linear)]
    if bad:
        raise ValueError(
            f"model.lora.targets={targets}: {', '.join(bad[:4])} "
            f"{'is not a linear layer' if len(bad) == 1 else 'are not linear layers'} (LoRA here adapts nn.Linear "
            f"only); name linear projections such as q_proj, v_proj, or [{LORA_TARGETS_ALL}]"
        )


def _no_match(model: nn.Module, targets: list[str], error: Exception) -> str:
    names = sorted(
        {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    )
    return (
        f"model.lora.targets={targets} matches no linear layer of this model ({error}); "
        f"its linear layers are named {', '.join(names)} (or give [{LORA_TARGETS_ALL}])"
    )
