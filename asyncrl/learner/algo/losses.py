"""Policy losses: pure functions on tensors, selected by name through ``POLICY_LOSSES``.

Three policies, named by whose log-probs they are (all ``[B, T]``, log pi(y_t | y_<t)):
  ``behavior_logprobs``  pi_behave: the actor that sampled the tokens (vLLM), as sampled.
  ``proximal_logprobs``  pi_prox:   the learner's weights at the start of this step (no grad).
                                    ``None`` means pi_prox := pi_behave (no recompute).
  ``logprobs``           pi_theta:  the weights being trained (carries the gradient).
``advantages [B, T]`` (sequence advantages broadcast by the caller), ``loss_mask [B, T]``
(nonzero = completion token that counts; prompt and padding are 0). They travel together in
one ``LossInputs`` record (each field documented with its shape); the scalar knobs in
``LossParams``.

Every loss has the signature ``fn(inputs: LossInputs, params: LossParams) -> LossOutput``
and is  ``aggregate(w * l_pg) + kl_coef * aggregate(KL) - entropy_coef * aggregate(H)``  where
``w`` is a detached behaviour weight built from pi_prox/pi_behave and ``l_pg`` the per-token
policy term; docs/algorithms.md gives each formula. Invariants: no gradient reaches
pi_prox, pi_behave, the advantages or ``ref_logprobs``; masked positions get zero gradient even
if they hold NaN/inf; with all three log-prob sets equal every ratio and weight is 1 and each
loss is plain PPO (``-A * r``) or REINFORCE (``-A * log pi``).

Metrics (floats, this micro-batch; combine with ``merge_metrics``): ``loss``, ``pg_loss``,
``tokens``; behaviour weights rho = pi_prox/pi_behave BEFORE truncation/masking (they measure
the policy lag): ``is_weight_mean/max/p99``, ``is_ess`` (normalised effective sample size),
``is_truncated_frac``, ``is_masked_frac`` (per token, or per sequence at ``is_level="sequence"``);
``clip_frac_low/high/dual`` (per token); ``approx_kl_behave`` (k3 estimate of
KL(pi_behave || pi_theta)); ``kl_ref`` and ``entropy`` (token means) when given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
from torch import Tensor

from asyncrl.learner.algo.aggregation import (  # re-exported: the trainer imports them from here
    _MAX_LOG_RATIO,  # clamp before exp() so a large log-prob gap cannot overflow to inf
    AGGREGATION_MODES,
    KL_ESTIMATORS,
    Aggregation,
    LossOutput,
    aggregate,
    kl_penalty,
    make_aggregation,
    masked_mean,
    merge_metrics,
    weight_stats,
)

__all__ = [
    "AGGREGATION_MODES",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "Aggregation",
    "LossInputs",
    "LossOutput",
    "LossParams",
    "PolicyLoss",
    "aggregate",
    "kl_penalty",
    "make_aggregation",
    "merge_metrics",
]


@dataclass(frozen=True)
class LossParams:
    """Every knob of the policy losses; config key ``algorithm.<field>`` (docs/algorithms.md)."""

    eps_low: float = 0.2  # PPO clip: r >= 1 - eps_low (for A < 0)
    eps_high: float = 0.2  # PPO clip: r <= 1 + eps_high (for A > 0); > eps_low = DAPO clip-higher
    clip_c: float | None = 3.0  # dual clip (verl's c): for A < 0 the loss is at most -c*A; None=off
    is_cap: float | None = 2.0  # truncate rho at this (decoupled_ppo, gspo, cispo, tis)
    is_level: str = "token"  # "token" rho per token | "sequence" geometric mean per sequence
    mask_low: float = 0.5  # masked_is: keep tokens/sequences with mask_low <= rho <= mask_high
    mask_high: float = 2.0
    is_objective: str = "ppo"  # tis, masked_is: "ppo" (clipped, needs pi_prox) | "pg" (REINFORCE)
    cispo_eps_low: float | None = None  # cispo weight >= 1 - this; None = no lower bound
    cispo_eps_high: float = 4.0  # cispo weight <= 1 + this
    kl_coef: float = 0.0  # weight of the KL-to-reference term
    kl_estimator: str = "k3"  # one of KL_ESTIMATORS
    kl_mode: str = "loss"  # "loss": add to the loss | "reward": caller shapes rewards instead
    entropy_coef: float = 0.0  # entropy bonus: loss -= entropy_coef * aggregate(entropy)

    def __post_init__(self) -> None:
        checks = [
            (0 <= self.eps_low < 1 and self.eps_high >= 0, "need 0 <= eps_low < 1, eps_high >= 0"),
            (self.clip_c is None or self.clip_c > 1, "clip_c must be > 1 or None"),
            (self.is_cap is None or self.is_cap > 0, "is_cap must be > 0 or None"),
            (self.is_level in ("token", "sequence"), "is_level must be token|sequence"),
            (0 <= self.mask_low < self.mask_high, "need 0 <= mask_low < mask_high"),
            (self.is_objective in ("ppo", "pg"), "is_objective must be ppo|pg"),
            (self.cispo_eps_low is None or 0 <= self.cispo_eps_low < 1, "need 0<=cispo_eps_low<1"),
            (self.cispo_eps_high >= 0, "cispo_eps_high must be >= 0"),
            (self.kl_coef >= 0, "kl_coef must be >= 0"),
            (self.kl_estimator in KL_ESTIMATORS, f"kl_estimator must be one of {KL_ESTIMATORS}"),
            (self.kl_mode in ("loss", "reward"), "kl_mode must be loss|reward"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"LossParams: {message} (got {self})")


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch's inputs of a policy loss. Token tensors are ``[B, T]``: B sequences
    (this micro-batch's rows), T completion positions, right-padded; positions outside
    ``loss_mask`` never reach a result, whatever they hold. Only ``logprobs`` may carry a
    gradient; the losses detach every other tensor. A new per-token input (e.g. a multi-turn
    mask) is one more field here, not one more argument of every loss."""

    logprobs: Tensor
    """``[B, T]`` log pi_theta: the weights being trained (the only input with a gradient)."""
    proximal_logprobs: Tensor | None
    """``[B, T]`` log pi_prox: the learner's weights at the start of the optimizer step
    (recomputed, no grad); None means pi_prox := pi_behave (no recompute)."""
    behavior_logprobs: Tensor
    """``[B, T]`` log pi_behave: the actor that sampled the tokens, as sampled."""
    advantages: Tensor
    """``[B, T]`` per-token advantages (sequence advantages broadcast by the caller)."""
    loss_mask: Tensor
    """``[B, T]`` bool or float; nonzero = a completion token that counts (not a weight)."""
    agg: Aggregation
    """The denominators of the WHOLE optimizer step (``make_aggregation`` over every rank's
    rows), so the micro-batches' losses sum to the step's loss."""
    ref_logprobs: Tensor | None = None
    """``[B, T]`` log pi_ref (the frozen reference) for the KL term; None = no KL metric,
    and required when ``kl_coef > 0`` with ``kl_mode="loss"``."""
    entropy: Tensor | None = None
    """``[B, T]`` per-token entropy of pi_theta; None = no entropy metric, and required when
    ``entropy_coef != 0``."""


class _Tokens(NamedTuple):
    """Inputs after cleaning: float32 or wider, zero outside the mask, constants detached."""

    lp: Tensor
    prox: Tensor
    behave: Tensor
    adv: Tensor
    mask: Tensor  # bool


def _clean(inputs: LossInputs, prox: Tensor | None) -> _Tokens:
    """``inputs``' tensors with ``prox`` as pi_prox (None: pi_behave), cleaned (``_Tokens``)."""
    lp, behave = inputs.logprobs, inputs.behavior_logprobs
    adv, mask = inputs.advantages, inputs.loss_mask
    prox = behave if prox is None else prox
    for name, t in (("proximal", prox), ("behavior", behave), ("advantages", adv), ("mask", mask)):
        if t.shape != lp.shape:
            raise ValueError(f"{name} {tuple(t.shape)} vs logprobs {tuple(lp.shape)}")
    m = mask != 0
    dtype = torch.promote_types(lp.dtype, torch.float32)
    zero = torch.zeros((), dtype=dtype, device=lp.device)
    # where() (not a multiply) so NaN/inf in padding cannot leak into values or gradients
    fix = lambda t: torch.where(m, t.to(dtype), zero)  # noqa: E731
    return _Tokens(fix(lp), fix(prox.detach()), fix(behave.detach()), fix(adv.detach()), m)


def _exp(log_ratio: Tensor) -> Tensor:
    return torch.exp(log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))


def _behavior_weight(
    log_rho: Tensor, m: Tensor, p: LossParams, kind: str
) -> tuple[Tensor, dict[str, Tensor]]:
    """Detached weight ``[B, T]`` from log rho (0 outside m): "truncate" at is_cap, or "mask"
    outside [mask_low, mask_high]; per token or per sequence (geometric mean). + metrics."""
    log_rho = log_rho.detach()
    if p.is_level == "sequence":
        seq = _exp(log_rho.sum(-1) / m.sum(-1).clamp(min=1))  # [B] geometric mean of rho_t
        units, valid = seq, m.any(-1)
        rho = seq[:, None].expand_as(log_rho)
    else:
        rho = _exp(log_rho)
        units, valid = rho, m
    if kind == "mask":
        keep = lambda r: (r >= p.mask_low) & (r <= p.mask_high)  # noqa: E731
        w, cut = rho * keep(rho), ~keep(units)
    else:
        cap = p.is_cap
        w = rho if cap is None else rho.clamp(max=cap)
        cut = torch.zeros_like(valid) if cap is None else units > cap
    frac = masked_mean(cut.to(log_rho.dtype), valid)
    zero = torch.zeros_like(frac)
    ws = weight_stats(units[valid])
    stats = {"is_weight_mean": ws["mean"], "is_weight_max": ws["max"], "is_weight_p99": ws["p99"]}
    stats["is_ess"] = ws["ess"]
    stats["is_truncated_frac"] = frac if kind != "mask" else zero
    stats["is_masked_frac"] = frac if kind == "mask" else zero
    return w, stats


def _ppo_clip(
    ratio: Tensor, adv: Tensor, m: Tensor, p: LossParams
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token clipped PPO loss ``max(-A r, -A clip(r))`` (dual clip: at most -c A for A < 0)."""
    loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - p.eps_low, 1 + p.eps_high))
    r, neg = ratio.detach(), adv < 0
    clipped = {"low": neg & (r < 1 - p.eps_low), "high": (adv > 0) & (r > 1 + p.eps_high)}
    if p.clip_c is not None:
        loss = torch.where(neg, torch.minimum(loss, -adv * p.clip_c), loss)
        clipped["dual"] = neg & (r > p.clip_c)
    return loss, _clip_metrics(clipped, m, ratio.dtype)


def _clip_metrics(clipped: dict[str, Tensor], m: Tensor, dtype: torch.dtype) -> dict[str, Tensor]:
    """Fractions of masked tokens per clip kind; kinds a loss does not have report 0."""
    none = torch.zeros_like(m)
    kinds = ("low", "high", "dual")
    return {f"clip_frac_{k}": masked_mean(clipped.get(k, none).to(dtype), m) for k in kinds}


def _finish(
    token_loss: Tensor, x: _Tokens, inputs: LossInputs, p: LossParams, metrics: dict[str, Tensor]
) -> LossOutput:
    """Aggregate, add the KL and entropy terms, turn metrics into floats (one device sync)."""
    agg, ref_logprobs, entropy = inputs.agg, inputs.ref_logprobs, inputs.entropy
    pg_loss = aggregate(token_loss, x.mask, agg)
    loss = pg_loss
    if p.kl_coef > 0 and p.kl_mode == "loss" and ref_logprobs is None:
        raise ValueError("kl_coef > 0 with kl_mode='loss' needs ref_logprobs")
    if ref_logprobs is not None:
        kl = kl_penalty(x.lp, torch.where(x.mask, ref_logprobs.to(x.lp.dtype), 0), p.kl_estimator)
        metrics["kl_ref"] = masked_mean(kl.detach(), x.mask)
        if p.kl_coef > 0 and p.kl_mode == "loss":
            metrics["kl_loss"] = aggregate(kl, x.mask, agg)
            loss = loss + p.kl_coef * metrics["kl_loss"]
    if p.entropy_coef != 0 and entropy is None:
        raise ValueError("entropy_coef != 0 needs the per-token entropy tensor")
    if entropy is not None:
        ent = torch.where(x.mask, entropy.to(x.lp.dtype), 0)
        metrics["entropy"] = masked_mean(ent.detach(), x.mask)
        if p.entropy_coef != 0:
            metrics["entropy_loss"] = aggregate(ent, x.mask, agg)
            loss = loss - p.entropy_coef * metrics["entropy_loss"]
    metrics["approx_kl_behave"] = masked_mean(kl_penalty(x.behave, x.lp.detach(), "k3"), x.mask)
    metrics.update(loss=loss, pg_loss=pg_loss, tokens=x.mask.sum())
    keys = sorted(metrics)
    values = torch.stack([metrics[k].detach().to(torch.float64).reshape(()) for k in keys])
    return LossOutput(loss=loss, metrics=dict(zip(keys, values.tolist(), strict=True)))


def decoupled_ppo(inputs: LossInputs, params: LossParams) -> LossOutput:
    """AReaL decoupled PPO: ``-min(rho, is_cap) * max(-A r, -A clip(r))``, r = pi_theta/pi_prox."""
    x = _clean(inputs, inputs.proximal_logprobs)
    w, metrics = _behavior_weight(x.prox - x.behave, x.mask, params, "truncate")
    pg, clip = _ppo_clip(_exp(x.lp - x.prox), x.adv, x.mask, params)
    return _finish(w * pg, x, inputs, params, metrics | clip)


def bypass_ppo(inputs: LossInputs, params: LossParams) -> LossOutput:
    """Two-policy PPO clipped around pi_behave: decoupled_ppo with pi_prox := pi_behave (w = 1).
    ``inputs.proximal_logprobs`` is ignored (may be None)."""
    return decoupled_ppo(replace(inputs, proximal_logprobs=None), params)


def _objective_proximal(proximal_logprobs: Tensor | None, p: LossParams) -> Tensor | None:
    """pi_prox as tis and masked_is use it: the "ppo" objective needs it, "pg" ignores it."""
    if p.is_objective != "ppo":
        return None
    if proximal_logprobs is None:
        raise ValueError("is_objective='ppo' needs proximal_logprobs; use 'pg' without them")
    return proximal_logprobs


def _corrected(x: _Tokens, p: LossParams, kind: str) -> tuple[Tensor, dict[str, Tensor]]:
    """tis (kind "truncate") and masked_is ("mask"): per-token ``w * l``, a behaviour weight on a
    PPO or REINFORCE term, + metrics. ppo: rho = pi_prox/pi_behave, l = clipped PPO on
    pi_theta/pi_prox; pg: rho = sg(pi_theta)/pi_behave, l = -A log pi_theta (pi_prox unused)."""
    ppo = p.is_objective == "ppo"
    reference = x.prox if ppo else x.lp.detach()
    w, metrics = _behavior_weight(reference - x.behave, x.mask, p, kind)
    if ppo:
        pg, clip = _ppo_clip(_exp(x.lp - x.prox), x.adv, x.mask, p)
    else:
        pg, clip = -x.adv * x.lp, _clip_metrics({}, x.mask, x.lp.dtype)
    return w * pg, metrics | clip


def tis(inputs: LossInputs, params: LossParams) -> LossOutput:
    """Truncated IS, token level by default: ``-min(rho, is_cap) * l`` (see _corrected)."""
    if params.is_cap is None:
        raise ValueError("tis needs is_cap (the truncation level)")
    x = _clean(inputs, _objective_proximal(inputs.proximal_logprobs, params))
    token_loss, metrics = _corrected(x, params, "truncate")
    return _finish(token_loss, x, inputs, params, metrics)


def masked_is(inputs: LossInputs, params: LossParams) -> LossOutput:
    """Masked IS: ``-rho * [mask_low <= rho <= mask_high] * l``; out-of-bounds tokens (or whole
    sequences at is_level="sequence", rho = geometric mean) get weight 0 but still count in the
    aggregation denominators."""
    x = _clean(inputs, _objective_proximal(inputs.proximal_logprobs, params))
    token_loss, metrics = _corrected(x, params, "mask")
    return _finish(token_loss, x, inputs, params, metrics)


def gspo(inputs: LossInputs, params: LossParams) -> LossOutput:
    """GSPO(-token): s_i = exp(mean_t log(pi_theta/pi_prox)) clipped per sequence; token t uses
    s_i * pi_theta / sg(pi_theta) (value s_i, gradient s_i * grad log pi_t). Times w as in
    decoupled_ppo. With seq_mean_token_mean and per-sequence A this is exactly GSPO."""
    x = _clean(inputs, inputs.proximal_logprobs)
    w, metrics = _behavior_weight(x.prox - x.behave, x.mask, params, "truncate")
    seq_log = ((x.lp - x.prox).sum(-1) / x.mask.sum(-1).clamp(min=1)).detach()
    seq_log = seq_log.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(seq_log[:, None] + x.lp - x.lp.detach())
    pg, clip = _ppo_clip(ratio, x.adv, x.mask, params)
    return _finish(w * pg, x, inputs, params, metrics | clip)


def cispo(inputs: LossInputs, params: LossParams) -> LossOutput:
    """CISPO (MiniMax-M1, Eq. 4, token level): ``-w * sg(clip(r, 1-cispo_eps_low,
    1+cispo_eps_high)) * A * log pi_theta``, r = pi_theta/pi_prox. Clipped tokens keep their
    gradient (only the weight is clipped). No lower bound by default, as in the paper."""
    x = _clean(inputs, inputs.proximal_logprobs)
    w, metrics = _behavior_weight(x.prox - x.behave, x.mask, params, "truncate")
    r = _exp(x.lp - x.prox).detach()
    low = None if params.cispo_eps_low is None else 1 - params.cispo_eps_low
    high = 1 + params.cispo_eps_high
    pg = -r.clamp(min=low, max=high) * x.adv * x.lp
    below = torch.zeros_like(x.mask) if low is None else r < low
    clip = _clip_metrics({"low": below, "high": r > high}, x.mask, r.dtype)
    return _finish(w * pg, x, inputs, params, metrics | clip)


PolicyLoss = Callable[[LossInputs, LossParams], LossOutput]
"""Every entry of ``POLICY_LOSSES``: ``loss(inputs, params) -> LossOutput``."""
POLICY_LOSSES: dict[str, PolicyLoss] = {
    "decoupled_ppo": decoupled_ppo,
    "bypass_ppo": bypass_ppo,
    "tis": tis,
    "masked_is": masked_is,
    "gspo": gspo,
    "cispo": cispo,
}
