"""Token-level math shared by losses and advantages: loss aggregation with global
denominators, masked statistics, the per-token KL estimators, and the loss output record.

Shapes: token tensors are ``[B, T]`` (B sequences, T completion positions, right-padded);
``loss_mask [B, T]`` is bool or float, nonzero = a completion token that counts (its value is not
used as a weight). Positions outside the mask never reach a result, whatever they hold.

Gradient accumulation invariant: an :class:`Aggregation` holds the denominators of the WHOLE
optimizer step (built once by :func:`make_aggregation` from the full loss mask), so for any split
of the step's sequences into micro-batches, ``sum(aggregate(v_k, m_k, agg)) == aggregate(v, m,
agg)`` -- same loss, same gradient. The caller SUMS micro-batch losses (never averages them).
With data-parallel ranks, build the Aggregation from the mask of all ranks and undo the ranks'
gradient averaging (multiply the loss by the world size).

| mode                      | loss                                              |
|---------------------------|---------------------------------------------------|
| ``token_mean``            | sum_{i,t} m*v / num_tokens                        |
| ``seq_mean_token_sum``    | sum_i (sum_t m*v) / num_seqs                      |
| ``seq_mean_token_mean``   | sum_i (sum_t m*v / L_i) / num_seqs                |
| ``seq_mean_token_sum_norm`` | sum_i (sum_t m*v) / (num_seqs * max_len)  (Dr.GRPO) |

``num_tokens`` = masked tokens in the step, ``num_seqs`` = sequences with at least one masked
token (an empty sequence neither contributes nor dilutes), ``L_i`` = masked tokens of sequence i
(local to the sequence, so micro-batching cannot change it), ``max_len`` = a constant length.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from asyncrl.core.config.algorithm import KL_ESTIMATORS  # the one home of the names

_EMPTY_DENOM = 1.0  # an all-masked step has a zero numerator; dividing by 1 keeps loss 0, not NaN
_MAX_LOG_RATIO = 20.0  # clamp before exp() so a large log-prob gap cannot overflow to inf
_MAX_KL = 10.0  # k3 grows like e^x: bound one token's k3 (as verl) so an outlier cannot dominate


def _token_mean(v: Tensor, m: Tensor, agg: Aggregation) -> Tensor:
    return v.sum() / _nonzero(agg.num_tokens)


def _seq_mean_token_sum(v: Tensor, m: Tensor, agg: Aggregation) -> Tensor:
    return v.sum() / _nonzero(agg.num_seqs)


def _seq_mean_token_mean(v: Tensor, m: Tensor, agg: Aggregation) -> Tensor:
    lengths = m.sum(-1).clamp(min=1).to(v.dtype)  # empty rows have a zero sum anyway
    return (v.sum(-1) / lengths).sum() / _nonzero(agg.num_seqs)


def _seq_mean_token_sum_norm(v: Tensor, m: Tensor, agg: Aggregation) -> Tensor:
    return v.sum() / _nonzero(agg.num_seqs * agg.max_len)


_REDUCERS: dict[str, Callable[[Tensor, Tensor, Aggregation], Tensor]] = {
    "token_mean": _token_mean,
    "seq_mean_token_sum": _seq_mean_token_sum,
    "seq_mean_token_mean": _seq_mean_token_mean,
    "seq_mean_token_sum_norm": _seq_mean_token_sum_norm,
}
AGGREGATION_MODES: tuple[str, ...] = tuple(_REDUCERS)


def _nonzero(denom: float) -> float:
    return denom if denom > 0 else _EMPTY_DENOM


@dataclass(frozen=True)
class Aggregation:
    """Global denominators of one optimizer step (see the module docstring for the formulas)."""

    mode: str
    num_tokens: float
    num_seqs: float
    max_len: float

    def __post_init__(self) -> None:
        if self.mode not in _REDUCERS:
            raise ValueError(f"aggregation mode {self.mode!r} not in {AGGREGATION_MODES}")
        if min(self.num_tokens, self.num_seqs) < 0 or self.max_len <= 0:
            raise ValueError(f"bad denominators: {self}")


def make_aggregation(mode: str, loss_mask: Tensor, max_len: float | None = None) -> Aggregation:
    """Denominators from the FULL step's ``loss_mask [B, T]``; ``max_len`` defaults to T."""
    m = loss_mask != 0
    return Aggregation(
        mode=mode,
        num_tokens=float(m.sum()),
        num_seqs=float(m.any(-1).sum()),
        max_len=float(m.shape[-1] if max_len is None else max_len),
    )


def aggregate(values: Tensor, loss_mask: Tensor, agg: Aggregation) -> Tensor:
    """Scalar loss from per-token ``values [B, T]``; this (micro-)batch's share of the step loss."""
    m = loss_mask != 0
    v = torch.where(m, values, torch.zeros((), dtype=values.dtype, device=values.device))
    return _REDUCERS[agg.mode](v, m, agg)


def masked_mean(values: Tensor, loss_mask: Tensor) -> Tensor:
    """Local mean over masked entries (a metric, not a loss); 0 when nothing is masked in."""
    m = loss_mask != 0
    v = torch.where(m, values, torch.zeros((), dtype=values.dtype, device=values.device))
    return v.sum() / m.sum().clamp(min=1)


def weight_stats(weights: Tensor) -> dict[str, Tensor]:
    """mean, max, p99 (nearest rank) and normalised ESS of a 1-D tensor of weights >= 0.

    ESS = (sum w)^2 / (n * sum w^2), in (0, 1]: 1 when all weights are equal, 1/n when one
    weight carries everything. All zeros for an empty tensor.
    """
    w = weights.detach().reshape(-1).to(torch.float64)
    n = w.numel()
    if n == 0:
        zero = torch.zeros((), dtype=torch.float64, device=w.device)
        return {"mean": zero, "max": zero, "p99": zero, "ess": zero}
    k = max(1, math.ceil(0.99 * n))  # kthvalue has no size limit, unlike torch.quantile
    sq = (w * w).sum()
    ess = torch.where(sq > 0, w.sum() ** 2 / (n * sq.clamp(min=1e-300)), torch.zeros_like(sq))
    return {"mean": w.mean(), "max": w.max(), "p99": w.kthvalue(k).values, "ess": ess}


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str) -> Tensor:
    """Per-token estimate ``[B, T]`` of KL(pi_theta || pi_ref) on tokens sampled from pi_theta.

    With x = log pi_ref - log pi_theta: k1 = -x (unbiased, but zero expected gradient as a loss
    term: use it as a reward penalty), k2 = x^2 / 2, k3 = e^x - 1 - x (unbiased, >= 0).
    Gradient flows through ``logprobs`` only. k1 and k2 are not clamped (they cannot overflow,
    and a clamp would only zero the gradient of the tokens that drifted furthest); k3 has
    verl's numerics (``low_var_kl``): x clamped at +-_MAX_LOG_RATIO before exp(), the result at
    _MAX_KL, so its gradient is 0 where k3 > _MAX_KL (verl also clamps at -_MAX_KL, which k3
    never reaches). tests/unit/learner/test_losses_vs_peers.py checks all three against verl.
    """
    x = ref_logprobs.detach() - logprobs
    if estimator == "k1":
        return -x
    if estimator == "k2":
        return 0.5 * x * x
    if estimator == "k3":
        x = x.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        return (torch.exp(x) - x - 1).clamp(max=_MAX_KL)
    raise ValueError(f"kl estimator {estimator!r} not in {KL_ESTIMATORS}")


@dataclass(frozen=True)
class LossOutput:
    """``loss``: scalar with grad, this micro-batch's share (sum it over micro-batches).

    ``metrics``: floats; how to combine them across micro-batches/ranks: :func:`merge_metrics`.
    """

    loss: Tensor
    metrics: dict[str, float] = field(default_factory=dict)


SUMMED_METRICS = frozenset({"loss", "pg_loss", "kl_loss", "entropy_loss", "value_loss", "tokens"})


def mean_over_updates(updates: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One rank's metrics of a step from those of its optimizer updates (``ppo_epochs x
    minibatches``): loss shares and ``tokens`` are averaged (each update's loss is a whole
    minibatch loss), ``*_max`` / ``*_p99`` take the max, the rest are token-weighted means.
    The result combines over ranks with ``merge_metrics`` like a single update's metrics."""
    if len(updates) == 1:
        return dict(updates[0])
    out = merge_metrics(updates)
    for key in SUMMED_METRICS:
        vals = [u[key] for u in updates if key in u]
        if vals:
            out[key] = sum(vals) / len(vals)
    return out


def merge_metrics(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Combine per-micro-batch metrics: loss shares and ``tokens`` are summed, ``*_max``,
    ``*_p95`` and ``*_p99`` take the max (the percentiles are then upper estimates), everything else is a mean weighted by
    ``tokens`` (sequence-level statistics are thereby length-weighted; an approximation)."""
    out: dict[str, float] = {}
    for key in {k for p in parts for k in p}:
        vals = [(p[key], p.get("tokens", 0.0)) for p in parts if key in p]
        if key in SUMMED_METRICS:
            out[key] = sum(v for v, _ in vals)
        elif key.endswith(("_max", "_p95", "_p99")):
            out[key] = max(v for v, _ in vals)
        else:
            weight = sum(t for _, t in vals)
            if weight > 0:
                out[key] = sum(v * t for v, t in vals) / weight
            else:
                out[key] = sum(v for v, _ in vals) / len(vals)
    return out
