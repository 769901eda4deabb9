"""Load a Hugging Face causal LM and shard it with FSDP2; token log-probs; full weights.

Every learner rank calls ``build_policy``; parameters become DTensors sharded over the
default process group (gloo on CPU, NCCL on GPU, see ``learner.device``). Parameters, gradients
and optimizer state are float32; ``model.dtype`` is the compute dtype: bfloat16 or float16
runs forward and backward in that dtype through FSDP2's ``MixedPrecisionPolicy`` (gradients
reduced in float32), the recipe of torchtitan, instead of training 16-bit weights directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_model_dir(model_dir: str | Path) -> Path:
    """``model_dir`` as a Path; a clear error if it is not an HF model directory."""
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model directory {path} has no config.json; set model.path to a local Hugging Face "
            "model directory (or model.path=demo for the built-in tiny model)"
        )
    return path


def attention_impl(setting: str, dtype: str, device: torch.device) -> str | None:
    """transformers' ``attn_implementation``: ``auto`` is flash_attention_2 on a GPU with the
    flash-attn package and a 16-bit compute dtype (its kernels need one), else transformers'
    default (sdpa); any other value is passed through."""
    if setting != "auto":
        return setting
    import importlib.util

    if device.type == "cuda" and dtype != "float32" and importlib.util.find_spec("flash_attn"):
        return "flash_attention_2"
    return None


def load_hf_model(
    model_dir: str | Path, dtype: str = "float32", attn: str | None = None
) -> nn.Module:
    """Load ``model_dir`` (a local HF directory) with transformers; clear error if missing."""
    from transformers import AutoModelForCausalLM

    path = check_model_dir(model_dir)
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=_DTYPES[dtype], attn_implementation=attn
    )
    model.config.use_cache = False
    return model


def shard_model(model: nn.Module, compute_dtype: str = "float32", layers=None) -> nn.Module:
    """FSDP2: shard each decoder layer (``layers``, default the HF model's), then the root
    (embeddings, norm, head). A 16-bit ``compute_dtype`` casts parameters for forward/backward
    and reduces gradients in float32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy()
    if compute_dtype != "float32":
        mp = MixedPrecisionPolicy(param_dtype=_DTYPES[compute_dtype], reduce_dtype=torch.float32)
    if layers is None:
        layers = getattr(getattr(model, "model", model), "layers", [])
    for layer in layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


def build_policy(model_dir: str | Path, dtype: str = "float32", attn: str = "auto") -> nn.Module:
    """Load float32 master weights on the learner's device and (when a process group exists)
    shard them, computing in ``dtype``; train mode, no dropout."""
    from learner.device import current_device

    device = current_device()
    model = load_hf_model(model_dir, "float32", attention_impl(attn, dtype, device)).to(device)
    if dist.is_initialized():
        model = shard_model(model, dtype)
    model.train()
    return model


def token_logprobs(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each next token and the per-position entropy.

    Args:
        input_ids: [B, L] right-padded sequences (prompt + completion).
        attention_mask: [B, L] 1 on real tokens.
    Returns:
        (logprobs [B, L-1], entropy [B, L-1]); position t scores token ``input_ids[:, t+1]``.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    logp_all = torch.log_softmax(logits, dim=-1)
    targets = input_ids[:, 1:].unsqueeze(-1)
    logprobs = logp_all.gather(-1, targets).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logprobs, entropy


def full_named_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, full tensor) for every parameter and buffer in the state dict.

    Collective: every rank must iterate it (DTensor ``full_tensor`` all-gathers).
    """
    for name, tensor in model.state_dict().items():
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        yield name, full.detach()
