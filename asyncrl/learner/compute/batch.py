"""Turn groups into padded training tensors, and move them between learner ranks.

Layout: each sample becomes one row ``prompt_ids + completion_ids`` right-padded to ``L``.
Per-token tensors are on the *shifted* grid ``[B, L-1]`` (position t scores token t+1), the
same grid ``asyncrl.learner.compute.model.token_logprobs`` returns, so masks and log-probs line up.

A multi-turn episode is one row like any other: its template/environment tokens (the sample's
``loss_mask`` 0) are in the row, so the model sees them as context, but out of the loss mask,
with no behaviour log-prob and no version (never trained, never judged for staleness).

Rows and episodes: ``rewards`` is per episode ``[G, n]``; ``episode [B]`` maps each row to its
episode's flat index ``g * n + i``. Without ``Sample.part`` > 0 (one row per episode) that is
the row's own index; under ``episode.agent_export=all`` an episode's other call chains are
rows of their own that share its index, so B > G * n, and ``collate`` pads each minibatch to
a multiple of the ranks with rows that train nothing (``episode`` -1; ``row_order``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.distributed as dist

from asyncrl.core.types import TRUNCATED_ENDS, Group, Sample, episode_index


@dataclass
class Batch:
    """B rows = all samples of the step's groups, in group order (G groups x n episodes,
    with an episode's other parts and padding rows: see the module docstring)."""

    input_ids: torch.Tensor
    """[B, L] int64, right-padded with 0."""
    attention_mask: torch.Tensor
    """[B, L] int64, 1 on prompt and completion tokens."""
    loss_mask: torch.Tensor
    """[B, L-1] float32, 1 where the scored token is a model token (a completion token with
    ``Sample.loss_mask`` 1); 0 on prompt, template/environment and padding tokens."""
    behavior_logprobs: torch.Tensor
    """[B, L-1] float32, log pi_behave of the model tokens (0 elsewhere)."""
    token_versions: torch.Tensor
    """[B, L-1] int64, version that sampled each model token (-1 elsewhere)."""
    rewards: torch.Tensor
    """[G, n] float32."""
    truncated: torch.Tensor
    """[B] float32, 1.0 where the row was cut short: its completion at the length limit
    (``finish_reason == "length"``) or its episode by a limit or a failure (``episode_end`` in
    ``TRUNCATED_ENDS``), else 0.0. ``algorithm.truncated`` (keep/mask/penalize) treats both
    alike (``asyncrl.learner.algo.truncation``)."""
    episode: torch.Tensor
    """[B] int64, the row's episode ``g * n + i`` (its reward ``rewards.view(-1)[episode]``);
    -1 on a padding row (no tokens trained). Non-decreasing over the real rows, each
    episode's part 0 first."""

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device) -> Batch:
        """The same batch with every tensor on ``device`` (no copy where it already is)."""
        return Batch(**{f.name: getattr(self, f.name).to(device) for f in fields(Batch)})

    def rows(self, index: torch.Tensor | slice) -> Batch:
        """A subset of rows (rewards are kept whole: they are per group)."""
        per_row = {f.name: getattr(self, f.name)[index] for f in fields(Batch)}
        return Batch(**{**per_row, "rewards": self.rewards})


def collate(groups: list[Group], minibatches: int = 1, world: int = 1) -> Batch:
    """Pad all samples of ``groups`` into one ``Batch`` of ``minibatches`` minibatches, each
    a multiple of ``world`` rows (module docstring). Groups must share the same n (episodes).

    Only the model tokens (``Sample.loss_mask`` 1) enter ``loss_mask``, ``behavior_logprobs``
    and ``token_versions``; the other completion tokens are context only."""
    n = len(groups[0].episodes)
    if any(len(g.episodes) != n for g in groups):
        raise ValueError("all groups of a step must have the same number of episodes")
    samples = [s for g in groups for s in g.samples]
    episode = [g * n + i for g, grp in enumerate(groups) for i in episode_index(grp.samples)]
    order = row_order(len(samples), minibatches, world)
    length = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    b = len(order)
    input_ids = torch.zeros(b, length, dtype=torch.long)
    attention = torch.zeros(b, length, dtype=torch.long)
    loss_mask = torch.zeros(b, length - 1)
    behavior = torch.zeros(b, length - 1)
    versions = torch.full((b, length - 1), -1, dtype=torch.long)
    truncated = torch.zeros(b)
    rows = torch.full((b,), -1, dtype=torch.long)
    for i, k in enumerate(order):
        if k < 0:  # a padding row: one token of context, none trained
            attention[i, 0] = 1
            continue
        s = samples[k]
        p, c = len(s.prompt_ids), len(s.completion_ids)
        input_ids[i, : p + c] = torch.tensor(s.prompt_ids + s.completion_ids)
        attention[i, : p + c] = 1
        # completion token j sits at position p+j and is scored at shifted position p+j-1
        mask = torch.tensor(s.loss_mask if s.loss_mask is not None else [1] * c).bool()
        span = slice(p - 1, p - 1 + c)
        loss_mask[i, span] = mask.float()
        behavior[i, span] = torch.where(mask, torch.tensor(s.behavior_logprobs), 0.0)
        versions[i, span] = torch.where(mask, torch.tensor(s.token_versions), -1)
        truncated[i], rows[i] = float(_cut_short(s)), episode[k]
    rewards = torch.tensor([g.rewards for g in groups], dtype=torch.float32)
    return Batch(input_ids, attention, loss_mask, behavior, versions, rewards, truncated, rows)


def row_order(count: int, minibatches: int = 1, world: int = 1) -> list[int]:
    """The sample in each batch row (-1: padding): ``count`` samples in order, cut into
    ``minibatches`` runs of ``ceil(count / minibatches)`` (the last shorter), each padded to
    the same multiple of ``world``. Which samples share a minibatch does not depend on
    ``world``, so every world size makes the same updates; without padding to do (``count``
    a multiple of ``minibatches * world``) row ``i`` is sample ``i``."""
    per = -(-count // minibatches)
    size = -(-per // world) * world
    order = []
    for m in range(minibatches):
        run = list(range(m * per, min((m + 1) * per, count)))
        order += run + [-1] * (size - len(run))
    return order


def _cut_short(s: Sample) -> bool:
    """The sample's completion hit the length limit, or its episode ended by a limit or a
    failure: either way its reward does not judge a finished answer."""
    return s.finish_reason == "length" or s.episode_end in TRUNCATED_ENDS


def broadcast_batch(batch: Batch | None, src: int = 0) -> Batch:
    """Broadcast ``batch`` from rank ``src`` to every rank (shapes first, then tensors)."""
    rank = dist.get_rank()
    names = [f.name for f in fields(Batch)]
    shapes = torch.full((len(names), 2), -1, dtype=torch.long)  # -1: no such dimension
    if rank == src:
        assert batch is not None
        for i, name in enumerate(names):
            shape = getattr(batch, name).shape
            shapes[i, : len(shape)] = torch.tensor(shape)
    dist.broadcast(shapes, src)
    out = {}
    for i, name in enumerate(names):
        dtype = getattr(batch, name).dtype if rank == src else _DTYPE_OF[name]
        shape = tuple(d for d in shapes[i].tolist() if d >= 0)
        t = getattr(batch, name) if rank == src else torch.empty(shape, dtype=dtype)
        dist.broadcast(t, src)
        out[name] = t
    return Batch(**out)


_DTYPE_OF = {
    "input_ids": torch.long,
    "attention_mask": torch.long,
    "loss_mask": torch.float32,
    "behavior_logprobs": torch.float32,
    "token_versions": torch.long,
    "rewards": torch.float32,
    "truncated": torch.float32,
    "episode": torch.long,
}


def shard_rows(batch: Batch, rank: int, world: int) -> Batch:
    """This rank's contiguous slice of rows (every rank gets the same count; B % world == 0)."""
    if batch.num_rows % world:
        raise ValueError(f"{batch.num_rows} rows cannot be split evenly over {world} ranks")
    per = batch.num_rows // world
    return batch.rows(slice(rank * per, (rank + 1) * per))
