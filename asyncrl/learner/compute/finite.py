"""Non-finite guards: NaN/inf never reaches the weights, the actors or a checkpoint.

    update:     loss (this rank's share) or global grad norm NaN/inf on any rank
                -> optimizer.step() skipped, gradients dropped, counted (``nonfinite_updates``)
    step:       ``learner.max_nonfinite_steps`` steps in a row with a skipped update -> fail
    weights:    any parameter NaN/inf after a step (finite gradients can still overflow, e.g.
                a huge lr) -> fail before the weights are synced or checkpointed
    checkpoint: ``save_checkpoint`` checks the weights again before it writes anything
    jump:       the weights' norm grew more than ``learner.max_weight_norm_jump`` times in one
                step (finite but exploded, e.g. ``learner.lr=1e30`` reached 1e29)
                -> fail before the weights are synced or checkpointed, naming learner.lr

Every decision is collective and the same on every rank (FSDP2 ranks must take the same
optimizer steps and reach the same collectives): each rank's local flags are all-reduced
(max) as a host tensor, over gloo (on a GPU the default group's ``cpu:gloo`` side).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn

from asyncrl.core.runtime.fatal import FatalError

GUARDED_METRICS = ("loss", "grad_norm", "value_loss", "critic_grad_norm")
"""The step metrics an update is skipped for (policy loss and grad norm, critic's)."""


class NonFiniteError(FatalError):
    """Training produced NaN/inf: a restart from the last checkpoint would do the same."""


def any_rank(flags: list[bool]) -> list[bool]:
    """Element-wise OR of ``flags`` over all ranks (collective when a group exists)."""
    t = torch.tensor([int(f) for f in flags], dtype=torch.int32)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(x) for x in t.tolist()]


def step_if_finite(
    optimizer: torch.optim.Optimizer, loss: torch.Tensor, grad_norm: torch.Tensor
) -> bool:
    """``optimizer.step()`` unless ``loss`` (this rank's) or ``grad_norm`` (global after
    ``clip_grad_norm_`` over DTensors) is NaN/inf on any rank; a skipped update's gradients
    are dropped. True if the update was applied. Collective."""
    bad = any_rank([not torch.isfinite(loss).all().item(), not torch.isfinite(grad_norm).item()])
    if any(bad):
        optimizer.zero_grad(set_to_none=True)
        return False
    optimizer.step()
    return True


def nonfinite_models(models: Mapping[str, nn.Module]) -> list[str]:
    """Names of ``models`` with a NaN/inf parameter on any rank (collective). Reads each
    rank's local shards once (one ``isfinite`` per tensor, one host sync per model)."""
    local = []
    for model in models.values():
        shards = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
        flags = [torch.isfinite(s.detach()).all() for s in shards]
        local.append(bool(flags) and not torch.stack(flags).all().item())
    return [name for name, bad in zip(models, any_rank(local), strict=True) if bad]


class NonFiniteGuard:
    """Counts the steps that skipped an update; ``max_in_a_row`` of them in a row (or weights
    that became non-finite) fail the run. Fed the step's metrics reduced over ranks, so its
    answer is the same on every rank."""

    def __init__(self, max_in_a_row: int) -> None:
        if max_in_a_row < 1:
            raise ValueError(f"max_in_a_row must be >= 1, got {max_in_a_row}")
        self.max_in_a_row = max_in_a_row
        self.in_a_row = 0

    def check(self, step: int, metrics: Mapping[str, float], broken: list[str]) -> str | None:
        """Count step ``step`` (its ``nonfinite_updates``); None to go on, else why to stop.
        ``broken``: the models whose weights are non-finite after the step."""
        skipped = int(metrics.get("nonfinite_updates", 0))
        self.in_a_row = self.in_a_row + 1 if skipped else 0
        if broken:
            return (
                f"step {step} made the {' and '.join(broken)} weights non-finite (NaN/inf) "
                f"({_describe(metrics)}): an applied update, whose loss and gradient norm were "
                "finite, overflowed them; lower learner.lr (algorithm.critic_lr for the critic) "
                "or learner.weight_decay"
            )
        if self.in_a_row < self.max_in_a_row:
            return None
        names = [k for k in GUARDED_METRICS if not math.isfinite(metrics.get(k, 0.0))]
        return (
            f"{self.in_a_row} steps in a row had a non-finite update "
            f"(learner.max_nonfinite_steps={self.max_in_a_row}), the last at step {step}: "
            f"non-finite {', '.join(names) or 'loss'} ({_describe(metrics)}); "
            f"{skipped} update(s) of that step were skipped, not applied"
        )


def _describe(metrics: Mapping[str, float]) -> str:
    return ", ".join(f"{k}={metrics[k]:.4g}" for k in GUARDED_METRICS if k in metrics)


def weight_norm(model: nn.Module) -> float:
    """The L2 norm of all of ``model``'s parameters (collective: each rank's local shards'
    squared norms, summed in float64, all-reduced)."""
    total = torch.zeros((), dtype=torch.float64)
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        # a reduction, not a copy of the shard (a 1.5B model's embedding is 0.9 GB)
        total += torch.linalg.vector_norm(local.detach()).double().cpu() ** 2
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total)
    return math.sqrt(total.item())


class WeightNormGuard:
    """Fails a step that multiplied the weights' norm by more than ``max_jump`` (0 = off):
    one AdamW step moves each weight by about lr, so a sane step changes the norm by a small
    fraction, and a jump means the update exploded the weights (which the non-finite guard
    sees only once they overflow)."""

    def __init__(self, max_jump: float) -> None:
        if max_jump != 0 and max_jump <= 1:
            raise ValueError(f"max_jump must be 0 (off) or > 1, got {max_jump}")
        self.max_jump = max_jump
        self.last: float | None = None

    def check(self, step: int, norm: float) -> str | None:
        """None to go on, else why to stop; remembers ``norm`` for the next step."""
        last, self.last = self.last, norm
        if not self.max_jump or last is None or last <= 0 or not math.isfinite(norm):
            return None  # a non-finite norm is the non-finite guard's to report
        if norm <= last * self.max_jump:
            return None
        return (
            f"step {step} multiplied the policy weights' norm by {norm / last:.3g} (from "
            f"{last:.4g} to {norm:.4g}; learner.max_weight_norm_jump={self.max_jump:g}): the "
            "update exploded the weights; lower learner.lr (or learner.weight_decay)"
        )
