"""Load a Hugging Face causal LM and shard it with FSDP2; token log-probs; full weights.

Every learner rank calls ``build_policy``; parameters become DTensors sharded over the
default process group (gloo on CPU, NCCL on GPU).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_hf_model(model_dir: str | Path, dtype: str = "float32") -> nn.Module:
    """Load ``model_dir`` (a local HF directory) with transformers; clear error if missing."""
    from transformers import AutoModelForCausalLM

    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model directory {path} has no config.json; set model.path to a local Hugging Face "
            "model directory (or model.path=demo for the built-in tiny model)"
        )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[dtype])
    model.config.use_cache = False
    return model


def shard_model(model: nn.Module) -> nn.Module:
    """FSDP2: shard each decoder layer, then the root (embeddings, norm, head)."""
    from torch.distributed.fsdp import fully_shard

    layers = getattr(getattr(model, "model", model), "layers", [])
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def build_policy(model_dir: str | Path, dtype: str = "float32") -> nn.Module:
    """Load and (when a process group exists) shard the policy; train mode, no dropout."""
    model = load_hf_model(model_dir, dtype)
    if dist.is_initialized():
        model = shard_model(model)
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
