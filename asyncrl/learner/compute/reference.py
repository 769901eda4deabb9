"""The frozen reference policy for the KL term: the initial policy, sharded like the learner.

Loaded only when ``algorithm.kl_coef > 0``. It is the model the run started from
(``model_dir``), also after a resume: the KL anchors the policy to where training began.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from asyncrl.core.config.job import Config
from asyncrl.learner.compute.device import current_device
from asyncrl.learner.compute.model import (
    attention_impl,
    fsdp_wanted,
    load_hf_model,
    load_sharded_hf_model,
    set_logprob_chunk_tokens,
    set_logprob_temperature,
    token_logprobs,
)
from asyncrl.learner.compute.packing import set_packed


def build_reference(
    model_dir: str | Path, cfg: Config | None = None, *, packed: bool = False
) -> nn.Module:
    """Load ``model_dir`` frozen in ``model.dtype`` (no gradients, no optimizer, so no float32
    master copy), eval mode, on the learner's device; FSDP2-sharded where ``fsdp_wanted`` (2+
    ranks, or offload), each rank loading only its shards
    (``asyncrl.learner.compute.model.load_sharded_hf_model``). ``cfg`` (None: the defaults)
    and ``packed``: as the policy's (``asyncrl.learner.compute.model.build_policy``), of
    which the reference reads ``model.dtype``, ``model.attn_implementation``,
    ``model.logprob_chunk_tokens``, ``sampling.temperature`` and ``learner.cpu_offload``."""
    cfg = cfg or Config()
    mc, offload = cfg.model, cfg.learner.cpu_offload
    device = current_device()
    attn_impl = attention_impl(mc.attn_implementation, mc.dtype, device, packed)
    if fsdp_wanted("float32", offload):  # frozen: it computes in the dtype it is loaded in
        model = load_sharded_hf_model(
            model_dir, mc.dtype, attn_impl, device, trainable=False, offload=offload
        )
    else:
        model = load_hf_model(model_dir, mc.dtype, attn_impl).to(device).requires_grad_(False)
    set_logprob_chunk_tokens(model, mc.logprob_chunk_tokens)
    set_logprob_temperature(model, cfg.sampling.temperature)
    set_packed(model, packed)
    return model.eval()


@torch.no_grad()
def reference_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    scored: torch.Tensor | None = None,
) -> torch.Tensor:
    """[B, L-1] log pi_ref of each next token, 0 off ``scored`` (``token_logprobs``; collective
    under FSDP2: every rank calls it)."""
    return token_logprobs(model, input_ids, attention_mask, entropy=False, scored=scored)[0]
