"""One learner step on this rank's rows: no-grad forwards -> advantages -> PPO updates.

    batch (same on every rank) -> minibatch slices -> this rank's rows of each
      plan:     micro-batches of those rows (asyncrl.learner.compute.micro_batches: by rows, or by a token
                budget over length-sorted rows; the same count on every rank)
      no grad:  pi_prox (if several updates), pi_ref (if kl_coef > 0), V_old (if a critic),
                per micro-batch, scattered back to the rows' [b, T] grid
      targets:  gather V_old / KL rows from all ranks -> asyncrl.learner.algo.targets.compute_targets
      truncated: algorithm.truncated=mask takes the rows cut at the length limit out of the
                loss masks (rows and the minibatch's aggregation), after the targets
      updates:  ppo_epochs x minibatches: POLICY_LOSSES[algorithm.policy_loss] (+ critic),
                gradients accumulated over the micro-batches

The loss and advantage functions are looked up by name in the registries
(``asyncrl.learner.algo.losses.POLICY_LOSSES``, ``asyncrl.learner.algo.advantages.ADVANTAGE_ESTIMATORS``);
this file only wires tensors to them.

Gradient scale: FSDP2 averages gradients over ranks, while the aggregation denominators are
global over the whole (mini)batch. Each rank's loss is therefore multiplied by ``world`` so
the averaged gradient equals the gradient of the full-batch loss.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace

import torch
import torch.distributed as dist
from torch import nn

from asyncrl.core.config.job import AlgorithmConfig
from asyncrl.core.runtime.faults import failpoint
from asyncrl.learner.algo.aggregation import mean_over_updates
from asyncrl.learner.algo.losses import (
    POLICY_LOSSES,
    LossInputs,
    LossParams,
    kl_penalty,
    make_aggregation,
    merge_metrics,
)
from asyncrl.learner.algo.stale_tokens import interpolated_proximal, masked_stale, stale_loss_mask
from asyncrl.learner.algo.targets import compute_targets
from asyncrl.learner.algo.truncation import clip_ratio, truncated_loss_mask
from asyncrl.learner.compute.batch import Batch, shard_rows
from asyncrl.learner.compute.critic import Critic
from asyncrl.learner.compute.finite import step_if_finite
from asyncrl.learner.compute.micro_batches import (
    MicroBatch,
    plan_metrics,
    plan_micro_batches,
    run_planned,
)
from asyncrl.learner.compute.model import token_logprobs
from asyncrl.learner.compute.reference import reference_logprobs


@dataclass
class StepContext:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    algo: AlgorithmConfig
    rank: int
    world: int
    grad_clip: float
    critic: Critic | None = None
    """Value model + optimizer (critic estimators, e.g. gae)."""
    reference: nn.Module | None = None
    """Frozen reference policy (kl_coef > 0)."""
    max_tokens: int | None = None
    """Generation limit: the constant of seq_mean_token_sum_norm and the overlong penalty."""
    micro_batch_rows: int = 0
    """Rows per forward/backward (gradient accumulation), padded to the batch's width; 0 = the
    whole shard. Ignored when ``max_tokens_per_micro_batch`` is set (the config refuses both)."""
    max_tokens_per_micro_batch: int = 0
    """Token budget of a forward/backward (rows x longest row) over length-sorted rows, each
    micro-batch trimmed to its longest row (``asyncrl.learner.compute.micro_batches``); 0 = off."""
    pack_sequences: bool = False
    """With a token budget: the budget counts real tokens, and the models (built with
    ``packed=True``) run each micro-batch as one stream (``asyncrl.learner.compute.packing``)."""
    say: Callable[[str], None] = field(default=lambda text: None, repr=False)
    """Rank 0's log line (``Hub.say``); quiet by default and on the other ranks."""
    said_oversize: bool = field(default=False, repr=False)
    """Whether ``say`` already told that a row exceeds the token budget (said once a run)."""


@dataclass
class _Shard:
    """This rank's rows of one minibatch and what the no-grad forwards gave for them."""

    rows: Batch
    agg_mask: torch.Tensor  # [b_all, T] loss mask of the whole minibatch (all ranks)
    plan: list[MicroBatch]  # this rank's micro-batches of ``rows`` (same count on every rank)
    proximal: torch.Tensor | None = None  # [b, T] pi_prox (None: single update, = pi_theta)
    interpolate_at: int | None = None  # stale_tokens=interpolate: V, pi_prox estimated per token
    ref: torch.Tensor | None = None  # [b, T] pi_ref
    old_values: torch.Tensor | None = None  # [b, T] V at the start of the step
    advantages: torch.Tensor | None = None  # [b, T]
    returns: torch.Tensor | None = None  # [b, T]


def loss_params(algo: AlgorithmConfig) -> LossParams:
    """The loss knobs: every ``LossParams`` field is the config key of the same name."""
    return LossParams(**{f.name: getattr(algo, f.name) for f in fields(LossParams)})


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


def train_on_batch(
    ctx: StepContext, batch: Batch, version: int | None = None, max_staleness: int = 0
) -> dict[str, float]:
    """Run ``ppo_epochs x minibatches`` optimizer updates on ``batch`` (same on all ranks).

    Each minibatch is a slice of the full batch; each rank trains on its shard of it, with
    aggregation denominators from the whole minibatch. Returns this rank's metrics over all
    its updates (``mean_over_updates``) plus the step's shaping metrics (combine ranks with
    ``reduce_metrics``), and ``nonfinite_updates``: the optimizer updates (policy and critic)
    skipped because their loss or gradient norm was NaN/inf (``asyncrl.learner.compute.finite``).
    ``version``, ``max_staleness``: the learner's version and bound, for
    ``algorithm.stale_tokens=mask`` (``asyncrl.learner.algo.stale_tokens``; None: no token is masked).
    """
    algo = ctx.algo
    slices = minibatch_slices(batch.num_rows, algo.minibatches, ctx.world)
    interpolate_at = version if algo.stale_tokens == "interpolate" else None
    shards = [_forward_no_grad(ctx, batch, s, interpolate_at) for s in slices]
    targets = _targets(ctx, batch, shards)
    for s, sh in zip(slices, shards, strict=True):
        sh.advantages = _rank_rows(targets.advantages[s], ctx.rank, ctx.world)
        if targets.returns is not None:
            sh.returns = _rank_rows(targets.returns[s], ctx.rank, ctx.world)
        # after the targets, so a masked row's reward still counts in its group's baseline
        mode = algo.truncated
        sh.agg_mask = truncated_loss_mask(sh.agg_mask, batch.truncated[s], mode)
        sh.rows = replace(
            sh.rows, loss_mask=truncated_loss_mask(sh.rows.loss_mask, sh.rows.truncated, mode)
        )
        if version is not None:  # stale tokens leave the loss, after the baselines too
            stale = (version, max_staleness, algo.stale_tokens)
            sh.agg_mask = stale_loss_mask(sh.agg_mask, batch.token_versions[s], *stale)
            sh.rows = replace(
                sh.rows,
                loss_mask=stale_loss_mask(sh.rows.loss_mask, sh.rows.token_versions, *stale),
            )
    updates: list[dict[str, float]] = []
    skipped = 0.0
    for _ in range(algo.ppo_epochs):
        for sh in shards:
            metrics = _update(ctx, sh)
            if ctx.critic is not None:
                metrics |= ctx.critic.update(
                    sh.rows, sh.old_values, sh.returns, sh.agg_mask, ctx.world, sh.plan
                )
            skipped += metrics.pop("nonfinite_updates") + metrics.pop("critic_nonfinite_updates", 0)
            updates.append(metrics)
    # a count, the same on every rank (the skip decision is collective): any mean keeps it
    return {**targets.metrics, **mean_over_updates(updates), "nonfinite_updates": skipped}


def _forward_no_grad(
    ctx: StepContext, batch: Batch, rows: slice, interpolate_at: int | None = None
) -> _Shard:
    """This rank's rows of minibatch ``rows``, their micro-batch plan (collective with a token
    budget) and their pi_prox / pi_ref / V_old, run per micro-batch: that bounds the
    activations (full-vocabulary logits) of the no-grad forwards, and every rank makes the
    same number of calls, so the FSDP2 collectives stay matched. ``interpolate_at`` (V, under
    ``stale_tokens=interpolate``): no pi_prox forward, it is estimated per token instead."""
    mb = shard_rows(batch.rows(rows), ctx.rank, ctx.world)
    plan = plan_micro_batches(
        mb.attention_mask,
        ctx.micro_batch_rows,
        ctx.max_tokens_per_micro_batch,
        ctx.world,
        ctx.pack_sequences,
    )
    _say_oversize(ctx, plan)
    sh = _Shard(mb, batch.loss_mask[rows], plan, interpolate_at=interpolate_at)
    several = ctx.algo.ppo_epochs * ctx.algo.minibatches > 1  # else pi_prox = pi_theta
    if several and interpolate_at is None:
        with torch.no_grad():  # no entropy: pi_prox is only a log-prob
            prox = lambda i, a, s: token_logprobs(ctx.model, i, a, entropy=False, scored=s)[0]  # noqa: E731
            sh.proximal = run_planned(prox, mb, plan)
    if ctx.reference is not None:
        ref = lambda i, a, s: reference_logprobs(ctx.reference, i, a, scored=s)  # noqa: E731
        sh.ref = run_planned(ref, mb, plan)
    if ctx.critic is not None:
        sh.old_values = run_planned(lambda i, a, s: ctx.critic.values(i, a), mb, plan)
    return sh


def _say_oversize(ctx: StepContext, plan: list[MicroBatch]) -> None:
    """Once a run: a row longer than the token budget ran as a micro-batch of its own."""
    budget = ctx.max_tokens_per_micro_batch
    longest = max(m.padded_tokens for m in plan)
    if budget and longest > budget and not ctx.said_oversize:
        ctx.said_oversize = True
        ctx.say(
            f"a row of {longest} tokens is longer than learner.max_tokens_per_micro_batch="
            f"{budget}: it runs as a micro-batch of its own (said once; the step metric "
            "micro_batch_tokens_max shows it)"
        )


def _targets(ctx: StepContext, batch: Batch, shards: list[_Shard]):
    """Advantages of the whole batch on every rank (critic values / KL gathered first)."""
    algo = ctx.algo
    values = kl = None
    if ctx.critic is not None:
        values = _gather_rows([sh.old_values for sh in shards], ctx.world)
    if ctx.reference is not None and algo.kl_mode == "reward":
        # the penalty of the sampled sequence under the policy that sampled it
        per_shard = [
            kl_penalty(sh.rows.behavior_logprobs, sh.ref, algo.kl_estimator) for sh in shards
        ]
        kl = _gather_rows(per_shard, ctx.world)
    return compute_targets(
        algo,
        batch.rewards,
        batch.loss_mask,
        values=values,
        kl=kl,
        max_tokens=ctx.max_tokens,
        truncated=batch.truncated,
        episode=batch.episode,
    )


def _update(ctx: StepContext, sh: _Shard) -> dict[str, float]:
    """One policy optimizer update on this rank's rows of one minibatch, accumulating the
    gradient over the micro-batches of ``sh.plan``. The aggregation's denominators are the
    whole minibatch's (all ranks, full grid), so the sum of the micro-batch losses and
    gradients is the minibatch's, however the rows are grouped and trimmed
    (tests/unit/learner/test_losses.py, tests/unit/learner/test_step_buckets.py). Not applied
    when the loss or the gradient norm is NaN/inf on any rank (``nonfinite_updates`` = 1)."""
    max_len = ctx.max_tokens or sh.agg_mask.shape[1]
    agg = make_aggregation(ctx.algo.aggregation, sh.agg_mask, max_len)
    if failpoint("learner.nan_loss"):  # test-only: NaN data, so a NaN loss and gradient
        sh = replace(sh, advantages=sh.advantages * float("nan"))
    ctx.optimizer.zero_grad(set_to_none=True)
    parts, loss = [], 0.0
    for micro in sh.plan:
        out = _policy_loss(ctx, sh, micro, agg)
        (out.loss * ctx.world).backward()
        parts.append(out.metrics)
        loss = loss + out.loss.detach()  # this rank's share of the minibatch loss
    grad_norm = torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), ctx.grad_clip)
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    applied = step_if_finite(ctx.optimizer, loss, grad_norm)
    metrics = merge_metrics(parts)  # loss shares and tokens summed, the rest token-weighted
    metrics |= plan_metrics(sh.rows, sh.plan)
    metrics["grad_norm"] = float(grad_norm)
    metrics["nonfinite_updates"] = float(not applied)
    return metrics


def _policy_loss(ctx: StepContext, sh: _Shard, micro: MicroBatch, agg):
    """``POLICY_LOSSES[algorithm.policy_loss]`` on one micro-batch of this rank's shard."""
    algo, mb = ctx.algo, micro.batch(sh.rows)
    logprobs, entropy = token_logprobs(
        ctx.model, mb.input_ids, mb.attention_mask, scored=mb.loss_mask
    )
    if sh.interpolate_at is not None:  # A-3PO: from each token's own version
        proximal = interpolated_proximal(
            mb.behavior_logprobs, logprobs, mb.token_versions, sh.interpolate_at
        )
    else:
        proximal = logprobs.detach() if sh.proximal is None else micro.tokens(sh.proximal)
    ref = None if sh.ref is None else micro.tokens(sh.ref)
    inputs = LossInputs(
        logprobs=logprobs,
        proximal_logprobs=proximal,
        behavior_logprobs=mb.behavior_logprobs,
        advantages=micro.tokens(sh.advantages),
        loss_mask=mb.loss_mask,
        agg=agg,
        ref_logprobs=ref,
        entropy=entropy if algo.entropy_coef else entropy.detach(),
    )
    return POLICY_LOSSES[algo.policy_loss](inputs, loss_params(algo))


def _rank_rows(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    per = t.shape[0] // world
    return t[rank * per : (rank + 1) * per]


def _gather_rows(per_minibatch: list[torch.Tensor], world: int) -> torch.Tensor:
    """Inverse of the sharding: this rank's [b, T] rows of each minibatch -> [B, T] in batch
    order (collective)."""
    if world == 1:
        return torch.cat(per_minibatch)
    out = []
    for t in per_minibatch:
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t.contiguous())
        out.extend(parts)
    return torch.cat(out)


def batch_metrics(batch: Batch, version: int, max_staleness: int | None = None) -> dict[str, float]:
    """Per-batch data statistics: groups, token staleness (``version`` - the version that
    sampled each completion token), completion lengths (mean, max, p95; with several ranks the
    p95 is the largest rank's, an upper estimate), ``response/clip_ratio``, the
    fraction of completions cut at the length limit, or episodes cut by a limit or ended by
    their environment (``asyncrl.core.types.TRUNCATED_ENDS``; whatever ``algorithm.truncated``
    does with them), and with ``max_staleness`` ``tokens_masked_stale``: the completion tokens
    older than the bound (0 under ``stale_tokens=drop_group``: such groups are not admitted;
    left out of the loss under ``mask``)."""
    m = batch.loss_mask != 0
    tokens = m.sum().clamp(min=1)
    stale = torch.where(m, version - batch.token_versions, 0)
    real = batch.episode >= 0  # padding rows (episode.agent_export=all) are no samples
    lengths = m[real].sum(-1).float()
    out = {
        "groups": float(batch.rewards.shape[0]),
        "staleness_token_mean": float(stale.sum() / tokens),
        "response_len_mean": float(lengths.mean()),
        "response_len_max": float(lengths.max()),
        "response_len_p95": float(torch.quantile(lengths, 0.95)),
        "response/clip_ratio": clip_ratio(batch.truncated[real]),
    }
    if int(real.sum()) != batch.rewards.numel():  # an episode trained as several rows
        out["samples_per_episode"] = float(real.sum()) / batch.rewards.numel()
    if max_staleness is not None:
        masked = masked_stale(batch.loss_mask, batch.token_versions, version, max_staleness)
        out["tokens_masked_stale"] = float(masked)
    return out


def reduce_metrics(metrics: dict[str, float], world: int) -> dict[str, float]:
    """Combine every rank's metrics (collective): loss shares and token counts summed, maxima,
    p95 and p99 as the max, the rest token-weighted means
    (``asyncrl.learner.algo.losses.merge_metrics``)."""
    if world == 1 or not dist.is_initialized():
        return dict(metrics)
    keys = sorted(metrics)
    # float64 host tensors over the gloo side of the group (all_gather_object would pickle)
    shape = torch.tensor([len(keys), zlib.crc32("\0".join(keys).encode())], dtype=torch.int64)
    shapes = [torch.empty_like(shape) for _ in range(world)]
    dist.all_gather(shapes, shape)
    if any(not torch.equal(s, shape) for s in shapes):
        raise RuntimeError(f"learner ranks reported different metric names (rank 0: {keys})")
    values = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64)
    gathered = [torch.empty_like(values) for _ in range(world)]
    dist.all_gather(gathered, values)
    return merge_metrics([dict(zip(keys, g.tolist(), strict=True)) for g in gathered])
