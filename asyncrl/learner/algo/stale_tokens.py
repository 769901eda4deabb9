"""Stale tokens, per token (``algorithm.stale_tokens``; docs/algorithms.md).

With ``actor.update_mode=keep`` one completion can span several policy versions: a long answer
started two versions ago is mostly fresh tokens behind a stale head. ``token_versions`` is a
``[B, T]`` int64 tensor aligned with the loss mask (the version that sampled each completion
token; -1 elsewhere, ``asyncrl.learner.compute.batch.Batch.token_versions``).

- ``drop_group`` (default): a group is trained or dropped whole by its oldest token
  (``V - version_min <= max_staleness``, buffer/staleness.py); nothing changes here.
- ``mask``: a group is admitted while its *newest* token is within the bound
  (``V - version_max <= max_staleness``), and each token older than the bound leaves the
  loss mask (no loss, out of every aggregation denominator), the rest of its completion
  trains. Applied after the advantages, so the sample's reward still counts in its group's
  baseline (as ``algorithm.truncated=mask`` does).

- ``interpolate`` (AReaL's A-3PO proximal approximation): admitted by the newest token as under
  ``mask``, no token leaves the loss, and each token's proximal log-prob is estimated from
  its own version instead of computed: ``log pi_prox = log pi_b + alpha (log pi_theta -
  log pi_b)``, ``alpha = (V - v) / (V + 1 - v)`` for a token sampled at version ``v`` by a
  learner at ``V`` (whose update makes ``V + 1``). A fresh token (``v = V``) gets
  ``pi_prox = pi_b``: the clip is around the policy that sampled it; a token ``k`` versions
  old gets ``pi_b^(1/(k+1)) pi_theta^(k/(k+1))``, so its behaviour weight ``pi_prox/pi_b`` is
  ``(pi_theta/pi_b)^(k/(k+1))`` and its ratio ``(pi_theta/pi_b)^(1/(k+1))``: the older the
  token, the more of the gap to ``pi_theta`` the weight corrects and the less the clip
  restrains. No forward pass recomputes ``pi_prox``, also with several updates a step
  (``ppo_epochs x minibatches > 1``), where the other modes run one.
"""

from __future__ import annotations

import torch
from torch import Tensor

from asyncrl.core.config.algorithm import STALE_TOKEN_MODES  # the one home of the names


def fresh_tokens(token_versions: Tensor, version: int, max_staleness: int) -> Tensor:
    """``[B, T]`` bool: True where a token is within the bound (``version - v <=
    max_staleness``) or is not a completion token (``v < 0``)."""
    return (token_versions < 0) | (version - token_versions <= max_staleness)


def stale_loss_mask(
    loss_mask: Tensor, token_versions: Tensor, version: int, max_staleness: int, mode: str
) -> Tensor:
    """``loss_mask [B, T]`` with every token older than the bound zeroed under ``mask``;
    unchanged (the same tensor) under ``drop_group`` and ``interpolate``."""
    if mode not in STALE_TOKEN_MODES:
        raise ValueError(f"stale_tokens mode {mode!r} not in {STALE_TOKEN_MODES}")
    if mode in ("drop_group", "interpolate"):
        return loss_mask
    return loss_mask * fresh_tokens(token_versions, version, max_staleness).to(loss_mask.dtype)


def masked_stale(
    loss_mask: Tensor, token_versions: Tensor, version: int, max_staleness: int
) -> int:
    """How many completion tokens of ``loss_mask`` are older than the bound."""
    stale = ~fresh_tokens(token_versions, version, max_staleness)
    return int(((loss_mask != 0) & stale).sum())


def interpolated_proximal(
    behavior: Tensor, current: Tensor, token_versions: Tensor, version: int
) -> Tensor:
    """``[B, T]`` A-3PO's ``log pi_prox``: ``behavior + alpha (current - behavior)``, ``alpha =
    (V - v) / (V + 1 - v)`` per token (``v`` its version, clamped to ``version`` = V, so a
    token newer than the learner counts as fresh); ``current`` (detached) where ``v < 0``
    (not a completion token). ``behavior``, ``current``: log-probs of the same tokens."""
    current = current.detach()
    gap = (version - token_versions.clamp(max=version)).to(current.dtype)
    alpha = gap / (gap + 1)
    estimate = behavior + alpha * (current - behavior)
    return torch.where(token_versions < 0, current, estimate)
