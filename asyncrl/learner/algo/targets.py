"""Rewards -> per-token advantages (and critic returns) for one step: config wiring only.

    episode rewards [G, n]
      truncated episodes' reward := truncated_reward (algorithm.truncated = penalize)
      + overlong penalty              (algorithm.overlong_frac > 0; DAPO soft punishment)
      - kl_coef * KL(pi_behave||pi_ref) (algorithm.kl_mode = reward; summed per episode for
                                       group estimators, per token for a critic estimator)
      -> ADVANTAGE_ESTIMATORS[algorithm.advantage]
           group estimator:  rewards [G, n] -> [G, n] -> each row's episode's, on its tokens
           critic estimator: (token rewards [B, T], values [B, T], mask) -> (A, returns),
                             each row ending with its episode's reward

An episode is one row unless an agent's episode kept several call chains
(``episode.agent_export=all``, ``asyncrl.learner.algo.episodes``): then its truncation is its
first row's, its length (overlong) and KL the sums over its rows, and every row of it gets
its advantage (a critic: its reward at each row's last token).

An estimator receives the config fields named like its keyword-only parameters
(``std_normalize``, ``group_baseline``, ``gamma``, ``lam``, ``whiten``), and an estimator that
takes ``values`` is a critic estimator: adding one to the registry needs no change here, and
nothing branches on estimator names. The math itself lives in ``asyncrl.learner.algo.advantages``.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import cast

import torch
from torch import Tensor

from asyncrl.core.config.job import AlgorithmConfig
from asyncrl.learner.algo.advantages import (
    ADVANTAGE_ESTIMATORS,
    overlong_penalty,
    place_at_last_token,
    to_token_level,
)
from asyncrl.learner.algo.episodes import first_rows, per_episode, row_episodes, to_rows
from asyncrl.learner.algo.truncation import truncated_rewards


def uses_critic(advantage: str) -> bool:
    """True when the estimator named ``advantage`` needs critic values (it takes ``values``)."""
    return "values" in inspect.signature(ADVANTAGE_ESTIMATORS[advantage]).parameters


def estimator_kwargs(fn, algo: AlgorithmConfig) -> dict:
    """The config fields named like ``fn``'s keyword-only parameters."""
    params = inspect.signature(fn).parameters.values()
    return {
        p.name: getattr(algo, p.name)
        for p in params
        if p.kind is inspect.Parameter.KEYWORD_ONLY and hasattr(algo, p.name)
    }


def overlong_cache_len(algo: AlgorithmConfig, max_tokens: int) -> int:
    """Tokens of the soft overlong zone: ``overlong_frac * max_tokens``, at least 1."""
    return max(1, math.ceil(algo.overlong_frac * max_tokens))


@dataclass
class Targets:
    """What the updates of one step train towards (full batch, same on every rank)."""

    advantages: Tensor
    """[B, T] per-token advantages (0 outside the loss mask)."""
    returns: Tensor | None = None
    """[B, T] value targets (critic estimators only)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Shaping diagnostics: ``overlong_penalty_mean``, ``kl_reward_mean`` when enabled."""


@torch.no_grad()
def compute_targets(
    algo: AlgorithmConfig,
    rewards: Tensor,
    loss_mask: Tensor,
    *,
    values: Tensor | None = None,
    kl: Tensor | None = None,
    max_tokens: int | None = None,
    truncated: Tensor | None = None,
    episode: Tensor | None = None,
) -> Targets:
    """Advantages for all rows of the step.

    Args:
        rewards: [G, n] task rewards of the episodes.
        loss_mask: [B, T] completion tokens of the rows.
        values: [B, T] critic values V(s_t) (required by critic estimators, else ignored).
        kl: [B, T] per-token KL estimate to the reference, subtracted from the rewards times
            ``kl_coef`` (``kl_mode=reward``; None = no penalty).
        max_tokens: the generation limit (``sampling.max_tokens``), for the overlong penalty.
        truncated: [B] 1.0 where the completion was cut at the length limit; with
            ``algorithm.truncated=penalize`` their task reward is replaced by
            ``truncated_reward`` first (None = none cut).
        episode: [B] the episode ``g * n + i`` of each row, -1 on a padding row (None = row
            ``r`` is episode ``r``, B = G * n).
    """
    mask = loss_mask != 0
    seq_rewards = rewards.reshape(-1).to(torch.float32)  # [E]
    count = seq_rewards.shape[0]
    ep = row_episodes(episode, mask.shape[0], mask.device)
    if truncated is not None:
        mode, value = algo.truncated, algo.truncated_reward
        cut = truncated[first_rows(ep, count)]
        seq_rewards = truncated_rewards(seq_rewards, cut, mode, value)
    metrics: dict[str, float] = {}
    if algo.overlong_frac > 0:
        if max_tokens is None:
            raise ValueError("algorithm.overlong_frac > 0 needs the generation limit max_tokens")
        cache = overlong_cache_len(algo, max_tokens)
        lengths = per_episode(mask.sum(-1), ep, count)
        pen = overlong_penalty(
            lengths, max_len=max_tokens, cache_len=cache, penalty=algo.overlong_penalty
        )
        seq_rewards = seq_rewards + pen
        metrics["overlong_penalty_mean"] = float(pen.mean())
    if kl is not None:
        kl = torch.where(mask, kl, 0)
        kl_sums = per_episode(kl.sum(-1), ep, count)
        metrics["kl_reward_mean"] = float(kl_sums.mean())  # per episode, before kl_coef
    fn = ADVANTAGE_ESTIMATORS[algo.advantage]
    kwargs = estimator_kwargs(fn, algo)
    if uses_critic(algo.advantage):
        if values is None:
            raise ValueError(f"advantage={algo.advantage!r} needs critic values")
        token_rewards = place_at_last_token(to_rows(seq_rewards, ep), loss_mask)
        if kl is not None:
            token_rewards = token_rewards - algo.kl_coef * kl
        adv, returns = fn(token_rewards, values.float(), loss_mask, **kwargs)
        return Targets(adv, returns, metrics)
    if kl is not None:
        seq_rewards = seq_rewards - algo.kl_coef * kl_sums
    adv = cast(Tensor, fn(seq_rewards.reshape(rewards.shape), **kwargs))  # one [G, n]: not gae
    return Targets(to_token_level(to_rows(adv, ep), loss_mask), None, metrics)
