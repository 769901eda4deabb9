"""Which of a rank's rows run together in one forward/backward, and how many columns they keep.

Two plans, chosen by config (``learner.micro_batch_rows`` / ``learner.max_tokens_per_micro_batch``,
at most one of them set):

  rows:   consecutive slices of ``micro_batch_rows`` rows (0 = all), every one padded to the
          batch's width ``L`` (the padded path);
  tokens: rows sorted by real length (longest first) and packed greedily so that each
          micro-batch's padded size, rows x its longest row, stays within the budget; each
          micro-batch keeps only the columns of its own longest row (the bucketed path).
          A row longer than the budget gets a micro-batch of its own (never an error).
  packed: the token plan, counting real tokens (the sum of the rows' lengths) against the
          budget: the forward runs the micro-batch as one stream without padding
          (``asyncrl.learner.compute.packing``, ``learner.pack_sequences``).

Right padding makes trimming exact: a real token's position id is its column index, which
trimming does not change, and a causal mask never lets a real token see a padding column, so
the model's outputs on real tokens are the same (tests/unit/learner/test_micro_batches.py).

Lockstep: under FSDP2 every rank must make the same number of forward/backward calls (each
all-gathers the same shards), but a rank of short rows packs into fewer micro-batches than a
rank of long ones. ``plan_micro_batches`` takes the max count over ranks (one all-reduce) and
a rank below it SPLITS its largest micro-batch of 2+ rows in two until it has as many. This
always terminates: every rank holds the same number of rows b (``asyncrl.learner.compute.batch.shard_rows``),
no rank has more than b micro-batches, and a rank with fewer than b has one of 2+ rows. It was
chosen over an extra forward whose loss is multiplied by 0 because a split adds no work (the two
halves are each trimmed to their own longest row, so padding can only shrink), while a dummy
forward/backward is pure waste and needs a fake row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from asyncrl.learner.compute.batch import Batch


@dataclass(frozen=True)
class MicroBatch:
    """Rows of one forward/backward and the input columns they keep."""

    index: Tensor
    """[k] int64 row indices into the rank's rows, on the rows' device."""
    width: int
    """Input columns kept: ``input_ids[index, :width]``; per-token tensors keep ``width - 1``."""
    real_tokens: int = 0
    """Packed: the rows' real tokens, the stream the forward processes; 0 = not packed."""

    @property
    def num_rows(self) -> int:
        return int(self.index.numel())

    @property
    def padded_tokens(self) -> int:
        """The tokens the forward processes: rows x width, padding included (the packed
        stream's length when packed)."""
        return self.real_tokens or self.num_rows * self.width

    def inputs(self, t: Tensor) -> Tensor:
        """[k, width] of an input tensor ``[b, L]`` (input_ids, attention_mask)."""
        return t[self.index, : self.width]

    def tokens(self, t: Tensor) -> Tensor:
        """[k, width-1] of a per-token tensor on the shifted grid ``[b, L-1]``."""
        return t[self.index, : self.width - 1]

    def batch(self, rows: Batch) -> Batch:
        """These rows of ``rows``, trimmed to ``width`` (rewards are kept whole)."""
        return Batch(
            self.inputs(rows.input_ids),
            self.inputs(rows.attention_mask),
            self.tokens(rows.loss_mask),
            self.tokens(rows.behavior_logprobs),
            self.tokens(rows.token_versions),
            rows.rewards,
            rows.truncated[self.index],
            rows.episode[self.index],
        )


def row_groups(n: int, size: int) -> list[list[int]]:
    """Consecutive groups of ``size`` rows covering ``range(n)`` (0 = one group of all)."""
    size = size or n or 1
    return [list(range(i, min(i + size, n))) for i in range(0, n, size)] or [[]]


def group_tokens(group: list[int], lengths: list[int], packed: bool) -> int:
    """The tokens a forward of ``group`` processes: the sum of its rows' lengths when packed,
    else rows x its longest row."""
    if packed:
        return sum(lengths[r] for r in group)
    return len(group) * max((lengths[r] for r in group), default=0)


def token_groups(lengths: list[int], budget: int, packed: bool = False) -> list[list[int]]:
    """Rows grouped by a token budget, taken longest first (ties in row order): a row joins
    the current group while the group with it processes ``<= budget`` tokens
    (``group_tokens``); packed, it joins the first group it fits in (first-fit decreasing:
    short rows fill the gaps the long ones left). A row longer than ``budget`` is a group
    of its own. Every group is sorted longest first."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        candidates = groups if packed else groups[-1:]
        fits = (g for g in candidates if group_tokens([*g, i], lengths, packed) <= budget)
        if (group := next(fits, None)) is not None:
            group.append(i)
        else:
            groups.append([i])
    return groups or [[]]


def split_to(
    groups: list[list[int]], lengths: list[int], count: int, packed: bool = False
) -> list[list[int]]:
    """``groups`` split until there are ``count``: each time the group of 2+ rows that
    processes the most tokens (``group_tokens``) is cut in two, longer rows first, in place
    of it."""
    groups = [list(g) for g in groups]
    while len(groups) < count:
        splittable = [i for i, g in enumerate(groups) if len(g) > 1]
        if not splittable:
            raise ValueError(
                f"cannot split {len(groups)} micro-batches of single rows into {count}"
            )
        i = max(splittable, key=lambda j: group_tokens(groups[j], lengths, packed))
        g = groups[i]
        half = (len(g) + 1) // 2
        groups[i : i + 1] = [g[:half], g[half:]]
    return groups


def plan_micro_batches(
    attention_mask: Tensor,
    micro_batch_rows: int,
    max_tokens: int,
    world: int,
    packed: bool = False,
) -> list[MicroBatch]:
    """This rank's micro-batches for its rows ``attention_mask [b, L]`` (right-padded).

    ``max_tokens > 0``: the token plan (``packed``: counting real tokens), equalised to the max
    count over ranks (collective when ``world > 1``: every rank must call it); else the row
    plan at full width ``L``. Each row is in exactly one micro-batch.
    """
    b, width = attention_mask.shape
    device = attention_mask.device
    if max_tokens <= 0:
        groups = row_groups(b, micro_batch_rows)
        return [MicroBatch(torch.tensor(g, dtype=torch.long, device=device), width) for g in groups]
    lengths = attention_mask.sum(-1).tolist()
    groups = token_groups(lengths, max_tokens, packed)
    if world > 1:
        count = torch.tensor([len(groups)], dtype=torch.long)  # host tensor: gloo on GPU too
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        groups = split_to(groups, lengths, int(count), packed)
    return [
        MicroBatch(
            torch.tensor(g, dtype=torch.long, device=device),
            max((int(lengths[r]) for r in g), default=width),
            group_tokens(g, lengths, True) if packed else 0,
        )
        for g in groups
    ]


def run_planned(
    fn: Callable[[Tensor, Tensor, Tensor], Tensor], rows: Batch, plan: list[MicroBatch]
) -> Tensor:
    """``fn(input_ids, attention_mask, loss_mask) -> [k, width-1]`` on every micro-batch,
    scattered back to the rows' order on the full grid ``[b, L-1]``; columns a micro-batch
    trimmed are 0 (they are outside every row's loss mask)."""
    out = None
    for m in plan:
        part = fn(m.inputs(rows.input_ids), m.inputs(rows.attention_mask), m.tokens(rows.loss_mask))
        if out is None:
            out = part.new_zeros(rows.loss_mask.shape)
        out[m.index, : m.width - 1] = part
    assert out is not None
    return out


def plan_metrics(rows: Batch, plan: list[MicroBatch]) -> dict[str, float]:
    """``micro_batches`` (forward/backward calls per update, the same on every rank),
    ``micro_batch_tokens_max`` (the largest rows x width; above the budget only when one row
    is longer than it) and ``padding_frac`` (padding among the tokens the forwards process)."""
    padded = sum(m.padded_tokens for m in plan)
    real = float(rows.attention_mask.sum())
    return {
        "micro_batches": float(len(plan)),
        "micro_batch_tokens_max": float(max(m.padded_tokens for m in plan)),
        "padding_frac": 1.0 - real / padded if padded else 0.0,
    }
