"""One learner step on this rank's rows: advantages -> (proximal log-probs) -> PPO updates.

The loss and advantage functions are looked up by name in the registries
(``learner.losses.POLICY_LOSSES``, ``learner.advantages.ADVANTAGE_ESTIMATORS``); this file
only wires tensors to them.

Gradient scale: FSDP2 averages gradients over ranks, while the aggregation denominators are
global over the whole (mini)batch. Each rank's loss is therefore multiplied by ``world`` so
the averaged gradient equals the gradient of the full-batch loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from asyncrl.config import AlgorithmConfig
from learner.advantages import ADVANTAGE_ESTIMATORS
from learner.batch import Batch, shard_rows
from learner.losses import POLICY_LOSSES, LossParams, make_aggregation
from learner.model import token_logprobs


@dataclass
class StepContext:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    algo: AlgorithmConfig
    rank: int
    world: int
    grad_clip: float


def loss_params(algo: AlgorithmConfig) -> LossParams:
    """Map config keys to the loss knobs (names as in docs/algorithms.md)."""
    return LossParams(
        eps_low=algo.eps_low, eps_high=algo.eps_high, clip_c=algo.clip_c, is_cap=algo.is_cap
    )


def sequence_advantages(rewards: torch.Tensor, algo: AlgorithmConfig) -> torch.Tensor:
    """[G, n] rewards -> [G*n] advantages in row order."""
    fn = ADVANTAGE_ESTIMATORS[algo.advantage]
    kwargs = {"std_normalize": algo.std_normalize} if algo.advantage == "grpo" else {}
    return fn(rewards, **kwargs).reshape(-1)


def _proximal(ctx: StepContext, local: Batch, needed: bool) -> torch.Tensor | None:
    if not needed:
        return None
    with torch.no_grad():
        logprobs, _ = token_logprobs(ctx.model, local.input_ids, local.attention_mask)
    return logprobs


def train_on_batch(ctx: StepContext, batch: Batch) -> dict[str, float]:
    """Run ``ppo_epochs x minibatches`` optimizer updates on ``batch`` (same on all ranks).

    Returns rank-local metrics of the last update plus the grad norm.
    """
    algo = ctx.algo
    adv_rows = sequence_advantages(batch.rewards, algo)  # [B]
    local = shard_rows(batch, ctx.rank, ctx.world)
    per = local.num_rows
    local_adv = adv_rows[ctx.rank * per : (ctx.rank + 1) * per]
    updates = algo.ppo_epochs * algo.minibatches
    prox_all = _proximal(ctx, local, needed=updates > 1)
    mb_size = max(1, per // algo.minibatches)
    metrics: dict[str, float] = {}
    for _ in range(algo.ppo_epochs):
        for m in range(algo.minibatches):
            idx = slice(m * mb_size, per if m == algo.minibatches - 1 else (m + 1) * mb_size)
            prox = None if prox_all is None else prox_all[idx]
            agg_mask = batch.loss_mask[_rows_of_all_ranks(idx, per, ctx.world)]
            metrics = _update(ctx, local.rows(idx), local_adv[idx], prox, agg_mask)
    return metrics


def _update(
    ctx: StepContext,
    mb: Batch,
    adv: torch.Tensor,
    prox: torch.Tensor | None,
    agg_mask: torch.Tensor,
) -> dict[str, float]:
    """One optimizer update; ``agg_mask`` is the loss mask of this minibatch on all ranks."""
    algo = ctx.algo
    logprobs, entropy = token_logprobs(ctx.model, mb.input_ids, mb.attention_mask)
    proximal = logprobs.detach() if prox is None else prox
    agg = make_aggregation(algo.aggregation, agg_mask, agg_mask.shape[1])
    advantages = adv.unsqueeze(1) * mb.loss_mask
    out = POLICY_LOSSES[algo.policy_loss](
        logprobs, proximal, mb.behavior_logprobs, advantages, mb.loss_mask, agg, loss_params(algo)
    )
    loss = out.loss
    ent = (entropy * mb.loss_mask).sum() / mb.loss_mask.sum().clamp(min=1)
    if algo.entropy_coef:
        loss = loss - algo.entropy_coef * ent
    ctx.optimizer.zero_grad(set_to_none=True)
    (loss * ctx.world).backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), ctx.grad_clip)
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    ctx.optimizer.step()
    metrics = dict(out.metrics)
    metrics.update(loss=float(loss.detach()), entropy=float(ent.detach()))
    metrics["grad_norm"] = float(grad_norm)
    return metrics


def _rows_of_all_ranks(idx: slice, per: int, world: int) -> torch.Tensor:
    """Row indices (in the full batch) of minibatch ``idx`` on every rank."""
    return torch.cat([torch.arange(r * per + idx.start, r * per + idx.stop) for r in range(world)])
