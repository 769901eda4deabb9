"""Advantage estimators and reward shaping: pure functions on tensors.

``ADVANTAGE_ESTIMATORS[name]`` maps a name to an estimator. Group estimators take
``rewards [G, n]`` (G prompts, n completions each, one scalar reward per completion) and return
per-sequence advantages ``[G, n]`` (broadcast them over tokens with :func:`to_token_level`).
Call them once on ALL groups of the optimizer step, before any micro-batch split (reinforce_pp
whitens over the whole batch). ``gae`` is the exception: per-token rewards, values and mask
``[B, T]`` in, ``(advantages, returns) [B, T]`` out. No estimator keeps a gradient.

Helpers: :func:`all_equal_groups` (DAPO dynamic sampling), :func:`overlong_penalty` (DAPO soft
overlong punishment), :func:`place_at_last_token`, :func:`to_token_level`, and the clipped
critic loss :func:`value_loss`. Rows that share an episode: ``asyncrl.learner.algo.episodes``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from asyncrl.learner.algo.aggregation import Aggregation, LossOutput, aggregate, masked_mean

_STD_EPS = 1e-6  # added to a std before dividing: an all-equal group (std 0) gets A = 0, not NaN


def _check_groups(rewards: Tensor) -> None:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [G, n], got {tuple(rewards.shape)}")


@torch.no_grad()
def grpo(rewards: Tensor, *, std_normalize: bool = True, eps: float = _STD_EPS) -> Tensor:
    """GRPO: ``A = (r - mean_group) / (std_group + eps)``; sample std (n - 1), as verl and TRL.

    ``std_normalize=False`` leaves ``r - mean_group`` (= dr_grpo). A group of one gets A = 0.
    """
    _check_groups(rewards)
    centered = rewards - rewards.mean(-1, keepdim=True)
    if not std_normalize or rewards.shape[-1] < 2:
        return centered
    return centered / (rewards.std(-1, keepdim=True) + eps)


def dr_grpo(rewards: Tensor) -> Tensor:
    """Dr.GRPO: ``A = r - mean_group``; no std scaling. Its length fix is the aggregation mode
    ``seq_mean_token_sum_norm`` (constant denominator), not part of the advantage."""
    return grpo(rewards, std_normalize=False)


@torch.no_grad()
def rloo(rewards: Tensor) -> Tensor:
    """RLOO: ``A_i = r_i - mean_{j != i} r_j = n/(n-1) * (r_i - mean_group)``; needs n >= 2."""
    _check_groups(rewards)
    n = rewards.shape[-1]
    if n < 2:
        raise ValueError("rloo needs at least 2 completions per group")
    return (rewards - rewards.mean(-1, keepdim=True)) * (n / (n - 1))


@torch.no_grad()
def reinforce_pp(rewards: Tensor, *, group_baseline: bool = False, eps: float = _STD_EPS) -> Tensor:
    """REINFORCE++: whiten over the whole batch, ``A = (x - mean_batch) / (std_batch + eps)``.

    x = r (batch baseline), or ``r - mean_group`` with ``group_baseline=True``
    (REINFORCE++-baseline). Sample std over all G*n rewards.
    """
    _check_groups(rewards)
    x = rewards - rewards.mean(-1, keepdim=True) if group_baseline else rewards
    centered = x - x.mean()
    if x.numel() < 2:
        return centered
    return centered / (x.std() + eps)


@torch.no_grad()
def gae(
    token_rewards: Tensor,
    values: Tensor,
    loss_mask: Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = False,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over the masked tokens of each row.

    ``token_rewards [B, T]`` (usually the sequence reward at the last token, see
    :func:`place_at_last_token`, minus any per-token KL penalty), ``values [B, T]`` critic
    estimates V(s_t). Unmasked positions are skipped (padding, or holes such as tool output):
    delta_t = r_t + gamma * V(next masked) - V_t, A_t = delta_t + gamma * lam * A(next masked),
    with V = A = 0 after the last masked token. Returns ``(advantages, returns = A + V)``, both
    ``[B, T]`` and 0 outside the mask. ``whiten`` normalises the advantages over the masked
    tokens of the whole batch: ``(A - mean) / (std + 1e-6)`` with the sample std (n - 1, as
    verl's masked_whiten); with fewer than 2 masked tokens the advantages are 0 (no error).
    """
    m = (loss_mask != 0).to(values.dtype)
    r = torch.where(m.bool(), token_rewards.to(values.dtype), 0)
    v = torch.where(m.bool(), values, 0)
    next_value = torch.zeros_like(v[:, 0])
    next_adv = torch.zeros_like(v[:, 0])
    adv = torch.zeros_like(v)
    for t in reversed(range(v.shape[1])):
        delta = r[:, t] + gamma * next_value - v[:, t]
        a_t = delta + gamma * lam * next_adv
        adv[:, t] = a_t * m[:, t]
        next_value = torch.where(m[:, t].bool(), v[:, t], next_value)
        next_adv = torch.where(m[:, t].bool(), a_t, next_adv)
    returns = (adv + v) * m
    if whiten:  # sample std (n - 1) as verl's masked_whiten and the group estimators; eps as grpo
        centered = (adv - masked_mean(adv, m)) * m
        n_minus_1 = (m.sum() - 1).clamp(min=1)  # < 2 masked tokens: centred only, i.e. all 0
        adv = centered / ((centered * centered).sum() / n_minus_1).sqrt().add(_STD_EPS)
    return adv, returns


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    loss_mask: Tensor,
    agg: Aggregation,
    *,
    clip_range: float | None = 0.2,
) -> LossOutput:
    """Clipped critic loss ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, +-c) - R)^2)``.

    ``[B, T]`` tensors; gradient flows through ``values`` only, and not where the clipped term
    is the larger one. ``clip_range=None``: plain ``0.5 * (V - R)^2``. Metrics: ``value_loss``
    (this micro-batch's share), ``vf_clip_frac``, ``value_mean``, ``returns_mean``, ``tokens``.
    """
    m = loss_mask != 0
    v = torch.where(m, values, 0)
    old, ret = torch.where(m, old_values.detach(), 0), torch.where(m, returns.detach(), 0)
    per_token = 0.5 * (v - ret) ** 2
    clipped_frac = torch.zeros((), dtype=v.dtype, device=v.device)
    if clip_range is not None:
        # clamp V itself (as verl's clip_by_value): inside the range v_clip is exactly v, so
        # the two terms tie and the token does not count as clipped (old + clamp(v - old)
        # differed from v by rounding and counted ~0.1% of unclipped tokens in vf_clip_frac)
        v_clip = v.clamp(old - clip_range, old + clip_range)
        clipped = 0.5 * (v_clip - ret) ** 2
        clipped_frac = masked_mean((clipped > per_token).to(v.dtype), m)
        per_token = torch.maximum(per_token, clipped)
    loss = aggregate(per_token, m, agg)
    metrics = {
        "value_loss": float(loss.detach()),
        "vf_clip_frac": float(clipped_frac),
        "value_mean": float(masked_mean(v.detach(), m)),
        "returns_mean": float(masked_mean(ret, m)),
        "tokens": float(m.sum()),
    }
    return LossOutput(loss=loss, metrics=metrics)


@torch.no_grad()
def all_equal_groups(rewards: Tensor, atol: float = 0.0) -> Tensor:
    """``[G] bool``: True where a group's rewards are all equal (within ``atol``). Such a group
    has zero advantage under any group baseline, so it only dilutes the batch; DAPO dynamic
    sampling drops it (``keep = ~all_equal_groups(rewards)``) and samples more."""
    _check_groups(rewards)
    return (rewards.amax(-1) - rewards.amin(-1)) <= atol


@torch.no_grad()
def overlong_penalty(
    lengths: Tensor, *, max_len: int, cache_len: int, penalty: float = 1.0
) -> Tensor:
    """DAPO soft overlong punishment, added to the reward; same shape as ``lengths``.

    0 for L <= max_len - cache_len, then linear down to -penalty at L = max_len, and -penalty
    beyond: ``penalty * clamp((max_len - cache_len - L) / cache_len, -1, 0)``.
    """
    if not 0 < cache_len <= max_len:
        raise ValueError(f"need 0 < cache_len <= max_len, got {cache_len}, {max_len}")
    start = max_len - cache_len
    dtype = lengths.dtype if lengths.is_floating_point() else torch.float32
    return penalty * ((start - lengths.to(dtype)) / cache_len).clamp(-1.0, 0.0)


def place_at_last_token(seq_rewards: Tensor, loss_mask: Tensor) -> Tensor:
    """``[B]`` -> ``[B, T]``: each reward at its row's last masked token, 0 elsewhere (and an
    all-masked row gets nothing)."""
    m = loss_mask != 0
    last = m.shape[-1] - 1 - m.flip(-1).to(torch.int8).argmax(-1)
    out = torch.zeros(m.shape, dtype=seq_rewards.dtype, device=seq_rewards.device)
    out[torch.arange(m.shape[0], device=m.device), last] = seq_rewards.reshape(-1)
    return torch.where(m, out, 0)


def to_token_level(seq_values: Tensor, loss_mask: Tensor) -> Tensor:
    """``[G, n]`` or ``[B]`` (row order) -> ``[B, T]``: each value on its row's masked tokens."""
    return torch.where(loss_mask != 0, seq_values.reshape(-1, 1), 0).to(seq_values.dtype)


# group estimators: (rewards [G, n], **params) -> [G, n]; gae: see its docstring
ADVANTAGE_ESTIMATORS: dict[str, Callable[..., Tensor | tuple[Tensor, Tensor]]] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "reinforce_pp": reinforce_pp,
    "gae": gae,
}
