"""Stale tokens, per token (``algorithm.stale_tokens``; issue 31; docs/algorithms.md).

With ``actor.update_mode=keep`` one completion can span several policy versions: a long answer
started two versions ago is mostly fresh tokens behind a stale head. ``token_versions`` is a
``[B, T]`` int64 tensor aligned with the loss mask (the version that sampled each completion
token; -1 elsewhere, ``learner.batch.Batch.token_versions``).

- ``drop_group`` (default): a group is trained or dropped whole by its oldest token
  (``V - version_min <= max_staleness``, buffer/staleness.py); nothing changes here.
- ``mask``: a group is admitted while its *newest* token is within the bound
  (``V - version_max <= max_staleness``), and each token older than the bound leaves the
  loss mask (no loss, out of every aggregation denominator), the rest of its completion
  trains. Applied after the advantages, so the sample's reward still counts in its group's
  baseline (as ``algorithm.truncated=mask`` does).

``interpolate`` (AReaL's A-3PO) is not built yet.
"""

from __future__ import annotations

from torch import Tensor

STALE_TOKEN_MODES = ("drop_group", "mask")
"""``algorithm.stale_tokens`` values (asyncrl/config_algorithm.py repeats them without torch)."""


def fresh_tokens(token_versions: Tensor, version: int, max_staleness: int) -> Tensor:
    """``[B, T]`` bool: True where a token is within the bound (``version - v <=
    max_staleness``) or is not a completion token (``v < 0``)."""
    return (token_versions < 0) | (version - token_versions <= max_staleness)


def stale_loss_mask(loss_mask: Tensor, token_versions: Tensor, version: int,
                    max_staleness: int, mode: str) -> Tensor:  # fmt: skip
    """``loss_mask [B, T]`` with every token older than the bound zeroed under ``mask``;
    unchanged (the same tensor) under ``drop_group``."""
    if mode not in STALE_TOKEN_MODES:
        raise ValueError(f"stale_tokens mode {mode!r} not in {STALE_TOKEN_MODES}")
    if mode == "drop_group":
        return loss_mask
    return loss_mask * fresh_tokens(token_versions, version, max_staleness).to(loss_mask.dtype)


def masked_stale(loss_mask: Tensor, token_versions: Tensor, version: int,
                 max_staleness: int) -> int:  # fmt: skip
    """How many completion tokens of ``loss_mask`` are older than the bound."""
    stale = ~fresh_tokens(token_versions, version, max_staleness)
    return int(((loss_mask != 0) & stale).sum())
