"""The learner loop (every rank runs it under torchrun).

rank 0: buffer.read -> drop stale -> collate --broadcast--> all ranks
all:    advantages -> PPO update(s) (FSDP2) -> V += 1
all:    every sync_every: gather full weights; rank 0 -> "update v" -> actors (collective)
all:    every checkpoint_every: DCP + HF export (atomic); rank 0 acks the trained groups
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from asyncrl.config import Config
from learner.batch import broadcast_batch, collate
from learner.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from learner.model import build_policy
from learner.step import StepContext, train_on_batch


@dataclass
class LearnerState:
    """What a checkpoint's state.json restores (besides model and optimizer)."""

    version: int = 0
    wall_s: float = 0.0
    groups_trained: int = 0
    unacked: list[str] = field(default_factory=list)


def init_distributed() -> tuple[int, int]:
    """Join the torchrun process group (gloo on CPU, NCCL on GPU)."""
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if "RANK" not in os.environ:  # a single process without torchrun
            os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
        dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_flag(rank: int, stop: bool) -> bool:
    """Rank 0 decides; every rank learns the decision (a 1-element broadcast)."""
    t = torch.tensor([1 if (rank == 0 and stop) else 0])
    dist.broadcast(t, 0)
    return bool(t.item())


def run_learner(cfg: Config, model_dir: str, run_dir: str, hub) -> LearnerState:
    """Train until ``learner.steps`` (or ``max_wall_s``); ``hub`` is rank 0's I/O (else None).

    ``hub`` (``learner.hub.Hub``) owns the buffer, the control plane, the weight sender and
    the run log, so this loop only sees tensors.
    """
    rank, world = init_distributed()
    torch.set_num_threads(cfg.learner.cpu_threads)
    torch.manual_seed(cfg.seed)
    model = build_policy(model_dir, cfg.model.dtype)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.learner.lr, weight_decay=cfg.learner.weight_decay
    )
    warmup = cfg.learner.warmup_steps
    state = _maybe_resume(run_dir, model, optimizer, hub)
    ctx = StepContext(model, optimizer, cfg.algorithm, rank, world, cfg.learner.grad_clip)
    start = time.monotonic() - state.wall_s
    if hub:
        hub.start(state.version)
    if state.version > 0:  # the resumed policy differs from the actors' initial weights
        _sync_weights(model, hub, state.version)
    while state.version < cfg.learner.steps:
        over = cfg.learner.max_wall_s and time.monotonic() - start > cfg.learner.max_wall_s
        if _stop_flag(rank, bool(over) or (hub is not None and hub.stop_requested())):
            break
        groups = hub.next_groups(state.version) if hub else None
        batch = broadcast_batch(collate(groups) if hub else None)
        _set_lr(optimizer, cfg.learner.lr * min(1.0, (state.version + 1) / max(1, warmup)))
        metrics = train_on_batch(ctx, batch)
        metrics["lr"] = optimizer.param_groups[0]["lr"]
        state.version += 1
        state.groups_trained += batch.rewards.shape[0]
        state.wall_s = time.monotonic() - start
        if state.version % cfg.learner.sync_every == 0:
            _sync_weights(model, hub, state.version)
        if hub:
            hub.after_step(state, metrics)
        every = cfg.learner.checkpoint_every
        if every and state.version % every == 0 and state.version < cfg.learner.steps:
            _checkpoint(run_dir, model, optimizer, state, model_dir, hub)
    _checkpoint(run_dir, model, optimizer, state, model_dir, hub)
    return state


def _set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def _sync_weights(model, hub, version: int) -> None:
    from learner.model import full_named_tensors

    named = list(full_named_tensors(model))  # collective on every rank
    if hub:
        hub.send_weights(named, version)


def _checkpoint(run_dir, model, optimizer, state: LearnerState, model_dir, hub) -> None:
    if hub:
        state.unacked = hub.trained_ids()
    # the ids of the groups this checkpoint contains: acked right after it is durable, and
    # acked again on resume in case the learner died in between (ack is idempotent)
    payload = {
        "version": state.version,
        "wall_s": state.wall_s,
        "groups_trained": state.groups_trained,
        "trained_ids": state.unacked,
    }
    save_checkpoint(run_dir, state.version, model, optimizer, payload, model_dir)
    if hub:
        hub.ack_trained()


def _maybe_resume(run_dir: str, model, optimizer, hub) -> LearnerState:
    path = latest_checkpoint(run_dir)
    if path is None:
        return LearnerState()
    saved = load_checkpoint(Path(path), model, optimizer)
    if hub:
        hub.say(f"resumed from {path} at version {saved['version']}")
        hub.ack_ids(saved.get("trained_ids", []))
    return LearnerState(saved["version"], saved["wall_s"], saved["groups_trained"])
