"""The learner's run state and its checkpoints: what a checkpoint's ``state.json`` restores
(``LearnerState``), saving one at a step (then acking the trained groups it holds and pruning
beyond ``learner.keep_checkpoints``), and where a learner starts: this run's newest complete
checkpoint that every rank sees, else ``learner.resume_from`` (another run's), else version 0.
The loop that calls these is ``asyncrl.learner.trainer``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from asyncrl.core.runtime.fatal import FatalError
from asyncrl.core.runtime.faults import failpoint
from asyncrl.learner.compute.step import StepContext
from asyncrl.learner.lora.base import base_fingerprint, base_mismatch
from asyncrl.learner.state.checkpoint import (
    adapter_only,
    latest_good_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
    verify_checkpoint,
)
from asyncrl.learner.state.checkpoint_hub import CheckpointHub


@dataclass
class LearnerState:
    """What a checkpoint's state.json restores (besides model and optimizer)."""

    version: int = 0
    wall_s: float = 0.0
    groups_trained: int = 0
    unacked: list[str] = field(default_factory=list)
    nonfinite_steps: int = 0
    """Steps that skipped an update (NaN/inf loss or gradient norm); their groups count as
    trained: the step consumed them, its metrics record the skip."""
    nonfinite_updates: int = 0
    """Optimizer updates skipped (policy and critic)."""


def _extra_state(ctx: StepContext) -> dict:
    """Models checkpointed alongside the policy: name -> (model, optimizer)."""
    return {"critic": (ctx.critic.model, ctx.critic.optimizer)} if ctx.critic else {}


@dataclass(frozen=True)
class SaveOptions:
    """How checkpoints are written (``learner.*``, ``model.*``)."""

    keep: int = 0
    """``learner.keep_checkpoints``: how many to keep (0: all)."""
    export_dtype: torch.dtype | None = None
    """The ``hf/`` export's dtype (the training dtype; None: float32)."""
    hf_export: bool = True
    """Write ``hf/``: always without LoRA, with it ``model.lora.export_merged``."""


def save_run_checkpoint(
    run_dir,
    ctx: StepContext,
    state: LearnerState,
    model_dir,
    hub: CheckpointHub,
    opts: SaveOptions = SaveOptions(),
) -> None:
    """Save ``state`` at its version, ack the groups it holds, prune beyond ``opts.keep``.
    With LoRA the checkpoint names its base (``lora_base``), which a resume checks."""
    state.unacked = hub.trained_ids()
    # the ids of the groups this checkpoint contains: acked right after it is durable, and
    # acked again on resume in case the learner died in between (ack is idempotent)
    payload = {
        "version": state.version,
        "wall_s": state.wall_s,
        "groups_trained": state.groups_trained,
        "nonfinite_steps": state.nonfinite_steps,
        "nonfinite_updates": state.nonfinite_updates,
        "trained_ids": state.unacked,
        "tallies": hub.tallies(),  # rank 0's summary totals, for a resume
    }
    if adapter_only(ctx.model):  # the base is not in the checkpoint: name it
        payload["lora_base"] = base_fingerprint(model_dir)
    save_checkpoint(
        run_dir,
        state.version,
        ctx.model,
        ctx.optimizer,
        payload,
        model_dir,
        extra=_extra_state(ctx),
        export_dtype=opts.export_dtype,
        hf_export=opts.hf_export,
    )
    failpoint("learner.before_ack", version=state.version)  # durable, groups not yet acked
    hub.ack_trained()
    if dist.get_rank() == 0:  # the new one is sealed: the oldest beyond keep can go
        for old in prune_checkpoints(run_dir, opts.keep, hub.say):
            hub.say(f"removed checkpoint {old.name} (learner.keep_checkpoints={opts.keep})")


def _load(path: Path, ctx: StepContext, model_dir: str) -> dict:
    """Load checkpoint ``path`` into ``ctx``'s models and optimizers; its state.json. An
    adapter-only checkpoint is refused unless ``model_dir`` is the base it was trained on."""
    import json

    saved = json.loads((path / "state.json").read_text())
    problem = base_mismatch(saved.get("lora_base"), model_dir) if model_dir else None
    if problem is not None:
        raise FatalError(
            f"checkpoint {path} holds LoRA adapters only, not their base model, and {problem}; "
            "resume with the model.path (or model preset) that run trained from"
        )
    return load_checkpoint(path, ctx.model, ctx.optimizer, extra=_extra_state(ctx))


def start_from(
    path: Path, ctx: StepContext, hub: CheckpointHub, model_dir: str = ""
) -> LearnerState:
    """``learner.resume_from``: another run's checkpoint as this run's start (weights,
    optimizer, version); checked first, on every rank (the path must be the same for all)."""
    problem = None
    if not (path / "COMPLETE").is_file() or not (path / "dcp").is_dir():
        problem = "not a complete checkpoint (no COMPLETE marker or dcp/ there)"
    elif ctx.rank == 0:
        problem = verify_checkpoint(path)
    bad = torch.tensor([int(problem is not None)])
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    if bad.item():
        raise FatalError(
            f"learner.resume_from={path}: {problem or 'not seen by every learner rank'}; give "
            "a checkpoint directory .../checkpoints/step_<V> that every learner node sees"
        )
    saved = _load(path, ctx, model_dir)
    hub.say(
        f"started from {path} (learner.resume_from) at version {saved['version']}; the "
        "other run's buffer state stays there"
    )
    return LearnerState(saved["version"], 0.0, 0)


def agreed_checkpoint(run_dir: str, rank: int, say=print) -> Path | None:
    """Rank 0's newest complete checkpoint, which every rank must see at the same path
    (collective). A learner over several nodes whose ``learner.checkpoint_dir`` is not one
    shared directory fails here, on every rank, naming what a node lacks, instead of ranks
    loading different versions or waiting in the load's collectives."""
    path = latest_good_checkpoint(run_dir, say) if rank == 0 else None  # rank 0 decides
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return path
    name = torch.tensor(list((path.name if path else "").encode().ljust(64)), dtype=torch.uint8)
    dist.broadcast(name, 0)
    chosen = bytes(name.tolist()).decode().strip()
    mine = Path(run_dir) / "checkpoints" / chosen if chosen else None
    ok = torch.tensor([int(mine is None or (mine / "COMPLETE").is_file())])
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if not ok.item():
        seen = mine is None or (mine / "COMPLETE").is_file()
        lacks = "" if seen else f" (rank {rank} lacks {mine})"
        raise FatalError(
            f"learner rank 0 resumes from checkpoints/{chosen}, which not every learner rank "
            f"sees{lacks}: learner.checkpoint_dir must be one directory shared by every "
            "learner node (e.g. NFS or Lustre)"
        )
    return mine


def maybe_resume(
    run_dir: str, ctx: StepContext, hub: CheckpointHub, resume_from: str = "", model_dir: str = ""
) -> LearnerState:
    """This run's newest checkpoint, else ``resume_from``'s, else version 0 (module
    docstring). ``model_dir``: the base model, checked against an adapter-only checkpoint."""
    path = agreed_checkpoint(run_dir, ctx.rank, hub.say)
    if path is None and resume_from:
        return start_from(Path(resume_from), ctx, hub, model_dir)
    if path is None:
        return LearnerState()
    saved = _load(Path(path), ctx, model_dir)
    hub.say(f"resumed from {path} at version {saved['version']}")
    hub.ack_ids(saved.get("trained_ids", []))
    hub.restore_tallies(saved.get("tallies", {}))
    return LearnerState(
        saved["version"],
        saved["wall_s"],
        saved["groups_trained"],
        nonfinite_steps=saved.get("nonfinite_steps", 0),
        nonfinite_updates=saved.get("nonfinite_updates", 0),
    )
