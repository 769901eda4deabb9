"""Completions cut at the length limit (``finish_reason == "length"``): counted, and kept,
masked or penalized (``algorithm.truncated``; docs/algorithms.md).

A real model's answers run from a few tokens to ``sampling.max_tokens``; one cut there has no
end, and its reward scores half an answer. ``truncated`` is a ``[B]`` float tensor (1.0 = cut,
``asyncrl.learner.compute.batch.Batch.truncated``), rows in group order like the batch's rows.

- ``keep``: nothing changes (the default; the behaviour before this option).
- ``mask``: the row's tokens leave the loss mask of the whole step: it adds no loss and is
  in no aggregation denominator (tokens, sequences). Its reward still counts in its group's
  baseline: the advantages are computed first, as under ``keep``.
- ``penalize``: the row's task reward is replaced by ``algorithm.truncated_reward`` before
  the reward shaping and the advantage; the loss is unchanged.

``mask`` is DAPO's overlong filtering as TRL implements it (``mask_truncated_completions``):
because the denominators then count only kept rows, the loss and its gradient equal those of
the batch without the truncated rows (given the same advantages), for every aggregation mode
and any micro-batch split (tests/unit/learner/test_truncation.py).
"""

from __future__ import annotations

from torch import Tensor

from asyncrl.core.config.algorithm import TRUNCATION_MODES  # the one home of the names


def _check(mode: str) -> None:
    if mode not in TRUNCATION_MODES:
        raise ValueError(f"truncated mode {mode!r} not in {TRUNCATION_MODES}")


def clip_ratio(truncated: Tensor) -> float:
    """Fraction of the rows cut at the length limit (verl's ``response/clip_ratio``); 0 for
    no rows."""
    return float(truncated.float().mean()) if truncated.numel() else 0.0


def truncated_rewards(rewards: Tensor, truncated: Tensor, mode: str, value: float) -> Tensor:
    """``rewards [B]`` with each truncated row's reward replaced by ``value`` under
    ``penalize``; unchanged (the same tensor) under ``keep`` and ``mask``."""
    _check(mode)
    if mode != "penalize":
        return rewards
    cut = truncated.reshape(rewards.shape) != 0
    return rewards.masked_fill(cut, value)


def truncated_loss_mask(loss_mask: Tensor, truncated: Tensor, mode: str) -> Tensor:
    """``loss_mask [B, T]`` with every truncated row zeroed under ``mask``; unchanged (the
    same tensor) under ``keep`` and ``penalize``. Build the step's aggregation from the result
    so the zeroed rows leave its denominators too."""
    _check(mode)
    if mode != "mask":
        return loss_mask
    keep = (truncated == 0).to(loss_mask.dtype)
    return loss_mask * keep[:, None]
