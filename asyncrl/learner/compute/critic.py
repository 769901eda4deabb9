"""The critic for PPO with GAE: the policy's architecture with a scalar value head.

``ValueModel`` = the policy's transformer body (``AutoModel``, loaded from the same HF
directory, so it starts from the policy's features) + ``Linear(hidden, 1)`` initialised to
zero (every value starts at exactly 0, on every rank). It is sharded with FSDP2 like the
policy and has its own AdamW. Values are on the shifted grid of ``asyncrl.learner.compute.model.token_logprobs``:
position t is V(s_t), the value of the prefix ``input_ids[:, :t+1]`` before token t+1.

The loss is ``asyncrl.learner.algo.advantages.value_loss`` (clipped around the values at the start of the
step) aggregated with ``token_mean``: every token's value error weighs the same, whatever
aggregation the policy loss uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from asyncrl.core.config.job import Config
from asyncrl.learner.algo.advantages import value_loss
from asyncrl.learner.algo.losses import make_aggregation, merge_metrics
from asyncrl.learner.compute.device import current_device
from asyncrl.learner.compute.finite import step_if_finite
from asyncrl.learner.compute.micro_batches import MicroBatch, plan_micro_batches
from asyncrl.learner.compute.model import (
    DTYPES,
    attention_impl,
    check_model_dir,
    enable_gradient_checkpointing,
    fsdp_wanted,
    shard_model,
)
from asyncrl.learner.compute.packing import is_packed, pack, packed_forward, set_packed

_VALUE_AGGREGATION = "token_mean"


class ValueModel(nn.Module):
    """``forward(input_ids [B, L], attention_mask [B, L]) -> values [B, L-1]`` (float32)."""

    def __init__(self, body: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.body = body
        self.head = nn.Linear(hidden_size, 1, dtype=next(body.parameters()).dtype)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if is_packed(
            self
        ):  # one stream of real tokens (asyncrl.learner.compute.packing); 0 off the scored
            packed = pack(input_ids, attention_mask)
            at = packed.scored()
            hidden = packed_forward(self.body, packed).last_hidden_state[0, at]
            return packed.to_grid(self.head(hidden).squeeze(-1).float(), at)
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.head(hidden[:, :-1]).squeeze(-1).float()


@dataclass
class Critic:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    value_clip: float | None
    grad_clip: float

    @torch.no_grad()
    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, L-1] values, no gradient (the step's V_old)."""
        return self.model(input_ids, attention_mask)

    def update(
        self,
        mb,
        old_values: torch.Tensor,
        returns: torch.Tensor,
        agg_mask: torch.Tensor,
        world: int,
        plan: list[MicroBatch] | None = None,
    ) -> dict[str, float]:
        """One optimizer update on this rank's rows ``mb`` (a ``Batch``); ``agg_mask`` is the
        loss mask of the whole minibatch on all ranks. The gradient accumulates over the
        micro-batches of ``plan`` (``asyncrl.learner.compute.micro_batches``; None = all rows at once), whose
        losses sum to the whole rows' loss (global denominators). Collective under FSDP2. Not
        applied when the loss or the gradient norm is NaN/inf on any rank
        (``critic_nonfinite_updates``)."""
        agg = make_aggregation(_VALUE_AGGREGATION, agg_mask)
        plan = plan or plan_micro_batches(mb.attention_mask, 0, 0, world)
        self.optimizer.zero_grad(set_to_none=True)
        values = torch.zeros_like(returns)  # the rows' values, for the explained variance
        parts, loss = [], 0.0
        for micro in plan:
            part = micro.batch(mb)
            v = self.model(part.input_ids, part.attention_mask)
            out = value_loss(
                v,
                micro.tokens(old_values),
                micro.tokens(returns),
                part.loss_mask,
                agg,
                clip_range=self.value_clip,
            )
            (out.loss * world).backward()  # FSDP2 averages over ranks; the denominators are global
            values[micro.index, : micro.width - 1] = v.detach()
            parts.append(out.metrics)
            loss = loss + out.loss.detach()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        applied = step_if_finite(self.optimizer, loss, grad_norm)
        metrics = merge_metrics(parts)  # value_loss summed, the rest token-weighted
        metrics.pop("tokens", None)  # the policy's count
        metrics["critic_grad_norm"] = float(grad_norm)
        metrics["critic_nonfinite_updates"] = float(not applied)
        metrics["value_explained_var"] = explained_variance(values, returns, mb.loss_mask)
        return metrics


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """``1 - Var(R - V) / Var(R)`` over the masked tokens of these rows: 1 for a perfect critic,
    0 for one no better than a constant (e.g. the zero-initialised head), negative when worse;
    0 when the returns are constant. Unlike the raw value loss, it does not grow with the
    returns' variance (which rises with the reward)."""
    m = mask != 0
    r, v = returns[m].double(), values[m].double()
    var = r.var(unbiased=False) if r.numel() else r.new_zeros(())
    if var <= 0:
        return 0.0
    return float(1 - (r - v).var(unbiased=False) / var)


def load_value_model(
    model_dir: str | Path, dtype: str = "float32", attn: str | None = None
) -> ValueModel:
    """The policy's body from ``model_dir`` (its LM head is not loaded) + a zero value head."""
    from transformers import AutoModel

    body = AutoModel.from_pretrained(
        check_model_dir(model_dir), dtype=DTYPES[dtype], attn_implementation=attn
    )
    body.config.use_cache = False
    return ValueModel(body, body.config.hidden_size)


def shard_value_model(
    model: ValueModel, compute_dtype: str = "float32", offload: bool = False
) -> ValueModel:
    """FSDP2 like the policy (``asyncrl.learner.compute.model.shard_model``): the body's decoder layers, then
    the root; a 16-bit ``compute_dtype`` is mixed precision; ``offload``: CPU offload."""
    return shard_model(model, compute_dtype, getattr(model.body, "layers", []), offload)


def load_sharded_value_model(
    model_dir: str | Path,
    attn: str | None,
    device: torch.device,
    compute_dtype: str,
    offload: bool = False,
) -> ValueModel:
    """``load_value_model`` (float32) then ``shard_value_model``, each rank loading only its
    shards (as ``asyncrl.learner.compute.model.load_sharded_hf_model``): the body's tensors come from the
    checkpoint's ``model.*`` names (its base-model prefix, as transformers strips it; the LM
    head is not read), the value head is zeroed. Falls back to the full load likewise."""
    from transformers import AutoConfig, AutoModel

    from asyncrl.learner.compute import sharded_load

    path = check_model_dir(model_dir)
    config = AutoConfig.from_pretrained(path)
    checkpoint = sharded_load.open_streamable(path, config.model_type)
    home = torch.device("cpu") if offload else device  # where the shards live
    if checkpoint is None:
        model = load_value_model(path, "float32", attn).to(home)
        return shard_value_model(model, compute_dtype, offload)

    def construct() -> ValueModel:
        body = AutoModel.from_config(config, dtype=torch.float32, attn_implementation=attn)
        return ValueModel(body, config.hidden_size)

    shard = lambda m: shard_value_model(m, compute_dtype, offload)  # noqa: E731
    model = sharded_load.build_sharded(construct, shard, home)
    prefix = f"{model.body.base_model_prefix}."
    if not any(key.startswith(prefix) for key in checkpoint.files):
        prefix = ""  # a checkpoint of the bare body
    with checkpoint:
        sharded_load.load_local_shards(model.body, checkpoint, prefix)
    with torch.no_grad():  # every value starts at 0 (materialize left the head uninitialised)
        model.head.weight.zero_()
        model.head.bias.zero_()
    model.body.config.use_cache = False
    return model


def build_critic(
    model_dir: str | Path, cfg: Config | None = None, *, packed: bool = False
) -> Critic:
    """Load float32 master weights on the learner's device computing in ``model.dtype`` (under
    a process group that ``fsdp_wanted`` each rank loads only its shards,
    ``load_sharded_value_model``), and give the critic its own AdamW at ``algorithm.critic_lr``
    (null = ``learner.lr``) with ``learner.weight_decay``; its updates clip values at
    ``algorithm.value_clip`` and gradients at ``learner.grad_clip``. ``cfg`` (None: the
    defaults) and ``packed``: as the policy's (``build_policy``), of which the critic also
    reads ``model.attn_implementation``, ``model.gradient_checkpointing`` and
    ``learner.cpu_offload``."""
    cfg = cfg or Config()
    mc, lc, algo = cfg.model, cfg.learner, cfg.algorithm
    device = current_device()
    attn_impl = attention_impl(mc.attn_implementation, mc.dtype, device, packed)
    if fsdp_wanted(mc.dtype, lc.cpu_offload):
        model = load_sharded_value_model(model_dir, attn_impl, device, mc.dtype, lc.cpu_offload)
    else:
        model = load_value_model(model_dir, "float32", attn_impl).to(device)
    set_packed(model, packed)
    model.train()
    if mc.gradient_checkpointing:
        enable_gradient_checkpointing(model.body)
    lr = algo.critic_lr or lc.lr
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=lc.weight_decay)
    return Critic(model, optimizer, algo.value_clip, lc.grad_clip)
