"""Rows <-> episodes: pure index math on the batch's ``episode [B]`` map.

A row is one sample; an episode is what earns a reward. They are one to one unless an agent's
episode kept several call chains (``episode.agent_export=all``): then its rows share its
flat index ``g * n + i``, and padding rows (-1) belong to none. Rewards and advantages live
on episodes ``[E]`` (E = G * n); the loss lives on rows.
"""

from __future__ import annotations

import torch
from torch import Tensor


def row_episodes(episode: Tensor | None, rows: int, device: torch.device | None = None) -> Tensor:
    """``[B]`` int64 episode of each row: ``episode`` as given, or (None) each row its own
    (on ``device``: where the batch's tensors are)."""
    if episode is None:
        return torch.arange(rows, device=device)
    if episode.shape != (rows,):
        raise ValueError(f"episode must be [{rows}], got {tuple(episode.shape)}")
    return episode.long()


def per_episode(values: Tensor, episode: Tensor, count: int) -> Tensor:
    """``[B]`` -> ``[E]``: the sum of each episode's rows (padding rows left out)."""
    real = episode >= 0
    out = torch.zeros(count, dtype=values.dtype, device=values.device)
    return out.index_add(0, episode[real], values[real])


def first_rows(episode: Tensor, count: int) -> Tensor:
    """``[E]`` the first row of each episode (its part 0); ValueError when one has none."""
    rows = torch.arange(episode.shape[0], device=episode.device)
    real = episode >= 0
    big = torch.full((count,), episode.shape[0], dtype=torch.long, device=episode.device)
    first = big.scatter_reduce(0, episode[real], rows[real], "amin")
    if bool((first == episode.shape[0]).any()):
        missing = int((first == episode.shape[0]).nonzero()[0])
        raise ValueError(f"episode {missing} of {count} has no row")
    return first


def to_rows(values: Tensor, episode: Tensor) -> Tensor:
    """``[E]`` -> ``[B]``: each row its episode's value (0 on a padding row)."""
    real = episode >= 0
    return torch.where(real, values.reshape(-1)[episode.clamp(min=0)], 0).to(values.dtype)
