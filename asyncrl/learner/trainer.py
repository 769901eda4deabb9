"""The learner loop (every rank runs it under torchrun).

rank 0: buffer.read -> drop stale (and, DAPO, all-equal-reward groups) -> collate --broadcast-->
all:    [pi_prox, pi_ref, V_old] -> advantages -> PPO update(s) [+ critic] (FSDP2) -> V += 1
all:    every sync_every: gather full weights; rank 0 -> "update v" -> actors (collective)
all:    every checkpoint_every: DCP + HF export (atomic); rank 0 acks the trained groups

An update with a NaN/inf loss or gradient norm is skipped; ``learner.max_nonfinite_steps``
such steps in a row, or weights made non-finite by a step, fail the run before those weights
reach the actors or a checkpoint (learner/compute/finite.py). A run that ends before its first step
fails too: it trained nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from asyncrl.core.config.job import Config
from asyncrl.core.runtime.fatal import FatalError
from asyncrl.core.runtime.faults import failpoint
from asyncrl.core.runtime.heap import freeze_startup_heap
from asyncrl.core.runtime.waiting import StopRequested
from asyncrl.learner.algo.targets import uses_critic
from asyncrl.learner.compute.batch import broadcast_batch, collate
from asyncrl.learner.compute.critic import build_critic
from asyncrl.learner.compute.device import current_device, init_distributed
from asyncrl.learner.compute.finite import (
    NonFiniteError,
    NonFiniteGuard,
    WeightNormGuard,
    nonfinite_models,
    weight_norm,
)
from asyncrl.learner.compute.model import build_policy, resolve_packing
from asyncrl.learner.compute.reference import build_reference
from asyncrl.learner.compute.step import StepContext, batch_metrics, reduce_metrics, train_on_batch
from asyncrl.learner.hub.protocol import LearnerHub
from asyncrl.learner.state.checkpoint import latest_checkpoint
from asyncrl.learner.state.run_state import (
    LearnerState,
    SaveOptions,
    maybe_resume,
    save_run_checkpoint,
)


class StoppedUntrained(RuntimeError):
    """A stop request (Ctrl-C/SIGTERM) ended the run before its first step: not a success,
    not a crash (``asyncrl.learner.main`` exits 130 without a traceback)."""


def _rank0_flag(rank: int, flag) -> bool:
    """Rank 0 decides; every rank learns the decision (a 1-element broadcast)."""
    t = torch.tensor([1 if (rank == 0 and flag) else 0])
    dist.broadcast(t, 0)
    return bool(t.item())


def _rank0_text(text: str) -> str:
    """Rank 0's ``text`` on every rank (collective): the ranks fail with the same message,
    whichever of them torchrun reports first."""
    if dist.get_world_size() == 1:
        return text
    data = torch.tensor(list(text.encode()), dtype=torch.uint8)
    size = torch.tensor([data.numel()])
    dist.broadcast(size, 0)
    if dist.get_rank() != 0:
        data = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(data, 0)
    return bytes(data.tolist()).decode()


def _start_or_stop(hub: LearnerHub, version: int) -> bool:
    """Rank 0: ``hub.start`` (waits for the actors); True if a stop request ended the wait."""
    try:
        hub.start(version)
    except StopRequested as e:
        hub.say(str(e))
        return True
    return False


def _read_or_stop(hub: LearnerHub, version: int, stop: bool) -> tuple[list | None, bool]:
    """Rank 0 reads the next batch before the ranks decide whether to go on: (groups, stop).

    A stop request during the read ends it; the groups read so far stay pending in the buffer
    (re-read on resume) and the loop ends with the usual final checkpoint. Rank 0 reads None
    when the read paused for a weight sync (``Hub.next_groups``). The other ranks read
    nothing (None): they receive the batch.
    """
    if stop:
        return None, stop
    try:
        return hub.next_groups(version), False
    except StopRequested as e:
        hub.say(str(e))
        return None, True


def build_step_context(cfg: Config, model_dir: str, rank: int, world: int) -> StepContext:
    """Policy + optimizer, and only what the algorithm needs: a critic for an estimator that
    takes values (gae), the frozen reference policy when ``kl_coef > 0``."""
    algo, lc = cfg.algorithm, cfg.learner
    device = current_device()
    if lc.cpu_offload and device.type != "cuda":
        raise FatalError(
            f"learner.cpu_offload=true needs a GPU learner; this one runs on {device.type} "
            "(FSDP2 offloads shards from an accelerator only): set learner.cpu_offload=false"
        )
    packed = resolve_packing(lc.pack_sequences, lc.max_tokens_per_micro_batch, device)
    model = build_policy(model_dir, cfg, packed=packed)
    trainable = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters only
    optimizer = torch.optim.AdamW(trainable, lr=lc.lr, weight_decay=lc.weight_decay)
    critic = build_critic(model_dir, cfg, packed=packed) if uses_critic(algo.advantage) else None
    reference = build_reference(model_dir, cfg, packed=packed) if algo.kl_coef > 0 else None
    return StepContext(
        model,
        optimizer,
        algo,
        rank,
        world,
        lc.grad_clip,
        critic=critic,
        reference=reference,
        max_tokens=cfg.sampling.max_tokens,
        micro_batch_rows=lc.micro_batch_rows,
        max_tokens_per_micro_batch=lc.max_tokens_per_micro_batch,
        pack_sequences=packed,
    )


def _layout(ctx: StepContext) -> str:
    """How a rank's rows run (the log's first line): the micro-batches and the attention."""
    attn = getattr(ctx.model.config, "_attn_implementation", None) or "sdpa"
    if ctx.pack_sequences:
        return f"packed micro-batches of <= {ctx.max_tokens_per_micro_batch} real tokens ({attn})"
    if ctx.max_tokens_per_micro_batch:
        return (
            f"length-bucketed micro-batches of <= {ctx.max_tokens_per_micro_batch} padded "
            f"tokens ({attn})"
        )
    rows = ctx.micro_batch_rows or "all"
    return f"micro-batches of {rows} rows padded to the batch's longest ({attn})"


@dataclass
class _Loop:
    """What the learner loop carries from step to step (per rank)."""

    cfg: Config
    ctx: StepContext
    hub: LearnerHub
    """Rank 0's ``Hub``; a ``NullHub`` on the other ranks."""
    rank: int
    state: LearnerState
    ckpt_dir: str
    """Where checkpoints go: every rank writes its shards there (all learner nodes share it)."""
    model_dir: str
    guards: tuple
    """``(NonFiniteGuard, WeightNormGuard)``."""
    start: float
    """``time.monotonic()`` of the run's start, resumed wall time included."""
    synced: int = 0
    """The version the actors hold."""

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def sync(self) -> None:
        """Send this version's weights; the actors hold them now (a validation may be due)."""
        _sync_weights(self.ctx.model, self.hub, self.state.version)
        self.synced = self.state.version
        self.hub.weights_at_actors(self.synced)

    def checkpoint(self) -> None:
        mc = self.cfg.model
        opts = SaveOptions(
            keep=self.cfg.learner.keep_checkpoints,
            export_dtype=getattr(torch, mc.dtype),
            hf_export=not mc.lora.enabled or mc.lora.export_merged,
        )
        save_run_checkpoint(self.ckpt_dir, self.ctx, self.state, self.model_dir, self.hub, opts)


def run_learner(cfg: Config, model_dir: str, run_dir: str, hub: LearnerHub) -> LearnerState:
    """Train until ``learner.steps`` (or ``max_wall_s``).

    ``hub`` is rank 0's I/O (``asyncrl.learner.hub.hub.Hub``: the buffer, the control plane, the weight
    sender and the run log), a ``asyncrl.learner.hub.null.NullHub`` on the other ranks, so this loop
    only sees tensors and calls the same methods on every rank.
    """
    loop = _prepare(cfg, model_dir, run_dir, hub)
    state, rank = loop.state, loop.rank
    if _rank0_flag(rank, _start_or_stop(hub, state.version)):
        if state.version == 0:
            raise _untrained(cfg, hub, rank, loop.elapsed())
        return state  # stopped while waiting for the actors: its checkpoint is the newest
    if cfg.learner.weight_sync and state.version > 0:  # resumed: not the actors' initial weights
        _sync_weights(loop.ctx.model, hub, state.version)
    loop.synced = state.version
    hub.weights_at_actors(loop.synced, start=True)  # eval.at_start
    while state.version < cfg.learner.steps:
        over = cfg.learner.max_wall_s and loop.elapsed() > cfg.learner.max_wall_s
        stop = bool(over) or hub.stop_requested()
        groups, stop = _read_or_stop(hub, state.version, stop)  # a stop may end the read
        if _rank0_flag(rank, stop):
            break
        if _rank0_flag(rank, rank == 0 and groups is None):  # actors re-registered: weights
            loop.sync()  # first, or they generate nothing
            continue
        _step(loop, groups)
    if state.version == 0:
        raise _untrained(cfg, hub, rank, loop.elapsed())
    loop.checkpoint()
    if _rank0_flag(rank, hub.end_validation_due(state.version)):  # eval.at_end
        if loop.synced != state.version:
            _sync_weights(loop.ctx.model, hub, state.version)
        hub.validate_final(state.version)
    return state


def _prepare(cfg: Config, model_dir: str, run_dir: str, hub: LearnerHub) -> _Loop:
    """Join the process group, build the model and optimizer, resume if a checkpoint is there."""
    rank, world = init_distributed(cfg.learner.device, cfg.learner.gpu_memory_fraction)
    torch.set_num_threads(cfg.learner.cpu_threads)
    torch.manual_seed(cfg.seed)
    ctx = build_step_context(cfg, model_dir, rank, world)
    ctx.say = hub.say  # rank 0's log (a row longer than the token budget is said once)
    hub.set_dynamic_sampling(cfg.algorithm.dynamic_sampling)  # DAPO: where groups are read
    hub.say(
        f"{world} rank(s) on {current_device().type} (process group "
        f"{dist.get_backend()}), float32 weights"
        f"{' offloaded to host memory' if cfg.learner.cpu_offload else ''}, "
        f"{cfg.model.dtype} compute; {_layout(ctx)}"
    )
    if cfg.model.lora.enabled:
        hub.say(_lora_line(cfg, ctx.model))
    ckpt_dir = cfg.learner.checkpoint_dir or run_dir
    state = maybe_resume(ckpt_dir, ctx, hub, cfg.learner.resume_from, model_dir)
    norm_guard = WeightNormGuard(cfg.learner.max_weight_norm_jump)
    norm_guard.last = weight_norm(ctx.model)  # the first step's jump counts too
    guards = (NonFiniteGuard(cfg.learner.max_nonfinite_steps), norm_guard)
    freeze_startup_heap(collect=True)  # model, optimizer, imports: never traversed again
    start = time.monotonic() - state.wall_s
    return _Loop(cfg, ctx, hub, rank, state, ckpt_dir, model_dir, guards, start)


def _step(loop: _Loop, groups: list | None) -> None:
    """One step on rank 0's ``groups`` (None on the other ranks: they receive the batch), then
    the weight sync, the step's log and a checkpoint, each when due."""
    cfg, hub, state = loop.cfg, loop.hub, loop.state
    failpoint("learner.after_read", version=state.version, groups=_ids(groups))
    split = (cfg.algorithm.minibatches, loop.ctx.world)  # episodes' extra rows pad to it
    batch = broadcast_batch(_collate(groups, *split)).to(current_device())
    metrics, problem = _train_step(loop.ctx, cfg, batch, state.version, loop.guards)
    state.version += 1
    state.groups_trained += batch.rewards.shape[0]
    state.nonfinite_steps += int(metrics["nonfinite_updates"] > 0)
    state.nonfinite_updates += int(metrics["nonfinite_updates"])
    state.wall_s = loop.elapsed()
    if problem:  # before these weights are synced or checkpointed
        raise _nonfinite(problem, state, metrics, hub, groups, loop.ckpt_dir, cfg)
    hub.step_done()  # the step ran: a crash from here on is not its data's fault
    due = cfg.learner.weight_sync and state.version - loop.synced >= cfg.learner.sync_every
    # a validation under way holds syncs while training can go on (learner/hub/validation.py)
    if due and _rank0_flag(loop.rank, hub.sync_allowed(state.version, loop.synced)):
        loop.sync()
    hub.after_step(state, metrics)
    every = cfg.learner.checkpoint_every
    if every and state.version % every == 0 and state.version < cfg.learner.steps:
        loop.checkpoint()
    failpoint("learner.after_step", version=state.version)


def _ids(groups: list | None) -> list[str] | None:
    """The group ids of rank 0's batch, for the ``learner.after_read`` trace; None elsewhere."""
    return None if groups is None else [g.group_id for g in groups]


def _train_step(
    ctx: StepContext, cfg: Config, batch, version: int, guards
) -> tuple[dict, str | None]:
    """One optimizer step at ``version`` (collective): its metrics, reduced over ranks, and
    why to stop (non-finite weights or updates, an exploded weight norm) or None."""
    guard, norm_guard = guards
    _warm_up_lr(ctx, cfg, version)
    bound = cfg.buffer.max_staleness
    metrics = reduce_metrics(train_on_batch(ctx, batch, version, bound), ctx.world)
    metrics |= batch_metrics(batch, version, bound)
    metrics["lr"] = ctx.optimizer.param_groups[0]["lr"]
    problem = guard.check(version, metrics, nonfinite_models(_models(ctx)))
    metrics["weight_norm"] = weight_norm(ctx.model)
    return metrics, problem or norm_guard.check(version, metrics["weight_norm"])


def _collate(groups: list | None, minibatches: int, world: int):
    """Rank 0's batch, each minibatch padded to a multiple of ``world`` rows; None on the
    other ranks (``broadcast_batch`` fills it in there)."""
    return None if groups is None else collate(groups, minibatches, world)


def _untrained(cfg: Config, hub: LearnerHub, rank: int, elapsed_s: float) -> Exception:
    """The error of a run that ended before its first step (same text on every rank): fatal
    on rank 0 when ``learner.max_wall_s`` ran out or the groups did (it would again after a
    restart), not on a stop request; the other ranks leave quietly with rank 0's text
    (``StoppedUntrained``)."""
    stopped = hub.stop_requested()
    limit = cfg.learner.max_wall_s
    if stopped:
        why = "a stop request (SIGTERM/Ctrl-C) ended the run before its first step"
    elif limit and elapsed_s >= limit:
        why = (
            f"learner.max_wall_s={limit:g} ran out after {elapsed_s:.1f} s, "
            "before the first step (its clock starts once the model is loaded and includes the "
            "wait for the actors); raise it, or set 0 for no limit"
        )
    else:  # no time limit hit: the groups ran out (the message once blamed max_wall_s=0)
        why = hub.no_batch_reason() or f"the run ended after {elapsed_s:.1f} s"
    text = _rank0_text(f"no step was trained: {why}")
    return FatalError(text) if rank == 0 and not stopped else StoppedUntrained(text)


def _nonfinite(
    problem: str, state: LearnerState, metrics: dict, hub: LearnerHub, groups, run_dir, cfg
):
    """The ``NonFiniteError`` of a failed step (rank 0's text on every rank); rank 0 logs the
    step's record first and names its groups, and the settings that can cause it."""
    hub.after_step(state, metrics)  # the failed step's record, in metrics.jsonl
    ids = _ids(groups) or []
    shown = ", ".join(ids[:8]) + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")
    text = (
        f"{problem}; the step's groups: {shown}; {state.nonfinite_steps} step(s) of this "
        f"run skipped updates; newest checkpoint: {latest_checkpoint(run_dir) or 'none yet'} "
        f"(none is written with non-finite weights). {nonfinite_suspects(cfg)}"
    )
    return NonFiniteError(_rank0_text(text))


def nonfinite_suspects(cfg: Config) -> str:
    """The settings that can make a step non-finite, with their values (pure)."""
    return (
        "Settings that can cause it: learner.lr="
        f"{cfg.learner.lr:g} (too high diverges), sampling.temperature={cfg.sampling.temperature:g} "
        f"(the learner divides the logits by it), learner.grad_clip={cfg.learner.grad_clip:g}, "
        f"model.dtype={cfg.model.dtype} (float16 overflows where bfloat16 does not), "
        f"algorithm.is_cap={cfg.algorithm.is_cap} (null = uncapped importance weights); and "
        "the rewards (task.reward_fn: reward/* in metrics.jsonl)"
    )


def _models(ctx: StepContext) -> dict:
    """The models that train: the policy, and the critic when there is one."""
    return {"policy": ctx.model, **({"critic": ctx.critic.model} if ctx.critic else {})}


def _warm_up_lr(ctx: StepContext, cfg: Config, version: int) -> None:
    """Linear warm-up over ``learner.warmup_steps`` for the policy and the critic."""
    scale = min(1.0, (version + 1) / max(1, cfg.learner.warmup_steps))
    _set_lr(ctx.optimizer, cfg.learner.lr * scale)
    if ctx.critic is not None:
        _set_lr(ctx.critic.optimizer, (cfg.algorithm.critic_lr or cfg.learner.lr) * scale)


def _lora_line(cfg: Config, model) -> str:
    """What ``model.lora`` made of the model (rank 0's share under FSDP2: the ratio holds)."""
    from asyncrl.learner.lora.adapters import adapted_layers, trainable_count

    lora = cfg.model.lora
    trained, total = trainable_count(model)
    return (
        f"LoRA rank {lora.rank}, alpha {lora.alpha:g} on {len(adapted_layers(model))} linear "
        f"layers: {trained:,} of {total:,} parameters train ({100 * trained / total:.2f}%); "
        "weight syncs and exports send the merged weights"
    )


def _set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def _sync_weights(model, hub: LearnerHub, version: int) -> None:
    """Send ``version`` to the actors (collective). Every rank gathers each full tensor as
    rank 0 streams it, so no rank ever holds the whole model gathered (nor a host copy of
    it: the gloo transport copies one tensor at a time, nccl sends from the GPU). A failed
    try is gathered again by every rank, as rank 0 says (its channel re-forms the group).
    With ``model.lora.sync=adapter`` only the adapters travel (``sync_tensors``)."""
    from asyncrl.learner.compute.model import sync_tensors

    rank = dist.get_rank() if dist.is_initialized() else 0
    attempt = 0
    while _rank0_flag(rank, hub.send_weights(sync_tensors(model), version, attempt)):
        attempt += 1
