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
        eps_low=algo.eps_low,
        eps_high=algo.eps_high,
        clip_c=algo.clip_c,
        is_cap=algo.is_cap,
        kl_coef=algo.kl_coef,
        kl_estimator=algo.kl_estimator,
        entropy_coef=algo.entropy_coef,
    )


def sequence_advantages(rewards: torch.Tensor, algo: AlgorithmConfig) -> torch.Tensor:
    """[G, n] rewards -> [G*n] advantages in row order."""
    fn = ADVANTAGE_ESTIMATORS[algo.advantage]
    kwargs = {"std_normalize": algo.std_normalize} if algo.advantage == "grpo" else {}
    return fn(rewards, **kwargs).reshape(-1)


def _proximal(ctx: StepContext, shards: list[Batch], needed: bool) -> list[torch.Tensor | None]:
    """pi_prox: the weights at the start of the step, for every minibatch shard (no grad)."""
    if not needed:
        return [None] * len(shards)
    with torch.no_grad():
        return [token_logprobs(ctx.model, b.input_ids, b.attention_mask)[0] for b in shards]


def minibatch_slices(num_rows: int, minibatches: int, world: int) -> list[slice]:
    """Full-batch row ranges of each minibatch; the same on every rank and for every world
    size, so a 2-rank run updates on exactly the rows a 1-rank run does."""
    size = num_rows // minibatches
    if size * minibatches != num_rows or size % world:
        raise ValueError(
            f"{num_rows} rows do not split into {minibatches} minibatches of a multiple of "
            f"{world} ranks; change learner.batch_groups or algorithm.minibatches"
        )
    return [slice(m * size, (m + 1) * size) for m in range(minibatches)]


def train_on_batch(ctx: StepContext, batch: Batch) -> dict[str, float]:
    """Run ``ppo_epochs x minibatches`` optimizer updates on ``batch`` (same on all ranks).

    Each minibatch is a slice of the full batch; each rank trains on its shard of it, with
    aggregation denominators from the whole minibatch. Returns the last update's metrics.
    """
    algo = ctx.algo
    adv_rows = sequence_advantages(batch.rewards, algo)  # [B]
    slices = minibatch_slices(batch.num_rows, algo.minibatches, ctx.world)
    shards = [shard_rows(batch.rows(s), ctx.rank, ctx.world) for s in slices]
    advs = [_shard(adv_rows[s], ctx.rank, ctx.world) for s in slices]
    masks = [batch.loss_mask[s] for s in slices]
    prox = _proximal(ctx, shards, needed=algo.ppo_epochs * algo.minibatches > 1)
    metrics: dict[str, float] = {}
    for _ in range(algo.ppo_epochs):
        for m in range(len(slices)):
            metrics = _update(ctx, shards[m], advs[m], prox[m], masks[m])
    return metrics


def _shard(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    per = t.shape[0] // world
    return t[rank * per : (rank + 1) * per]


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
        logprobs, proximal, mb.behavior_logprobs, advantages, mb.loss_mask, agg, loss_params(algo),
        entropy=entropy if algo.entropy_coef else entropy.detach(),
    )  # fmt: skip
    loss = out.loss
    ctx.optimizer.zero_grad(set_to_none=True)
    (loss * ctx.world).backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), ctx.grad_clip)
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    ctx.optimizer.step()
    metrics = dict(out.metrics)
    metrics["grad_norm"] = float(grad_norm)
    return metrics
