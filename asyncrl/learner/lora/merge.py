"""The merged weights of an adapted model under the base model's names.

Actors and exports get ordinary Hugging Face weights: for every LoRA layer ``X``,
``X.weight = X.base_layer.weight + scale * lora_B @ lora_A`` (``[out, r] @ [r, in]``, in
float32, cast back to the base weight's dtype) and ``X.bias = X.base_layer.bias``; every other
tensor passes under its own name. Pure tensor math on ``(name, tensor)`` pairs, so it runs on
the full tensors that ``full_named_tensors`` gathers under FSDP2.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from asyncrl.learner.lora.adapters import ADAPTER

BASE = ".base_layer."
LORA_A = f".lora_A.{ADAPTER}.weight"
LORA_B = f".lora_B.{ADAPTER}.weight"


def merged(
    named: Iterable[tuple[str, torch.Tensor]], scale: float
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(HF name, tensor)``: ``named`` (an adapted model's state dict, in its order)
    with each LoRA layer's base weight merged with its adapter (``scale`` = alpha / rank) and
    the adapter tensors left out. A base weight is held until its layer's ``lora_A`` and
    ``lora_B`` have come (they follow it in a state dict), so at most one layer's tensors wait.
    ValueError if a layer's adapter is incomplete at the end."""
    waiting: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named:
        layer, part = _split(name)
        if layer is None:
            yield name, tensor
            continue
        if part == "bias":
            yield f"{layer}.bias", tensor
            continue
        parts = waiting.setdefault(layer, {})
        parts[part] = tensor
        if len(parts) == 3:
            del waiting[layer]
            yield f"{layer}.weight", merge_weight(parts["weight"], parts["A"], parts["B"], scale)
    if waiting:
        raise ValueError(f"LoRA layers without base weight or adapter: {sorted(waiting)[:4]}")


def merge_weight(
    weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float
) -> torch.Tensor:
    """``weight [out, in] + scale * b [out, r] @ a [r, in]``, computed in float32."""
    delta = (b.float() @ a.float()) * scale
    return (weight.float() + delta).to(weight.dtype)


def _split(name: str) -> tuple[str | None, str]:
    """``("X", "weight" | "bias" | "A" | "B")`` for a LoRA layer ``X``'s tensors, else
    ``(None, "")``."""
    if name.endswith(LORA_A):
        return name[: -len(LORA_A)], "A"
    if name.endswith(LORA_B):
        return name[: -len(LORA_B)], "B"
    if BASE in name:
        layer, _, rest = name.partition(BASE)
        return layer, rest
    return None, ""
