"""Packed micro-batches: a micro-batch's rows as one stream of real tokens, no padding.

A micro-batch of ``k`` right-padded rows ``input_ids [k, width]`` becomes one row
``[1, S]`` (``S`` = its real tokens) whose position ids restart at 0 for every row::

    rows  [a0 a1 a2 .  ]      stream  [a0 a1 a2 b0 b1 b2 b3]
          [b0 b1 b2 b3 ]      pos     [ 0  1  2  0  1  2  3]

Restarting position ids alone do not stop a token from attending to the rows packed before
it (measured on an H100 with transformers 5.17, sdpa and flex_attention), so every
attention gets an explicit document mask, causal within a row and nothing across rows:

  ``flash_attention_2``  no mask: transformers sees the restarting position ids and calls
                         flash-attn's varlen kernel with the rows' boundaries;
  ``flex_attention``     a ``BlockMask`` (torch's ``create_block_mask``): blocks that cross
                         rows are skipped, not computed and masked;
  ``sdpa``               a ``[1, 1, S, S]`` boolean mask (True = attend): S^2 bytes, the
                         fallback where neither kernel is at hand, and the CPU test path;
  ``eager``              the same mask as additive float (0 or the dtype's minimum).

A 4-D mask is used by transformers as given (``masking_utils``), in every version we run.
The outputs on each row's tokens are those of running the row alone
(tests/unit/learner/test_packing.py; tests/gpu for flex_attention and flash-attn on a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

PACKED_ATTENTION = ("flash_attention_2", "flex_attention", "sdpa", "eager")
_ATTR = "asyncrl_packed"  # set on a model by set_packed


@dataclass(frozen=True)
class Packed:
    """One micro-batch as a stream of ``S`` real tokens."""

    input_ids: Tensor
    """[1, S] the rows' real tokens, row after row."""
    position_ids: Tensor
    """[1, S] each token's position in its row (restarts at 0)."""
    row: Tensor
    """[S] the row (0..k-1) each token comes from."""
    shape: tuple[int, int]
    """(k, width) of the padded rows it was packed from."""

    @property
    def pos(self) -> Tensor:
        """[S] each token's column in its padded row (= its position id)."""
        return self.position_ids[0]

    def scored(self) -> Tensor:
        """[n] stream positions whose next token is in the same row (the positions a
        log-prob or a value is taken at), ascending; the target of ``i`` is ``i + 1``."""
        same = self.row[1:] == self.row[:-1]
        return same.nonzero().squeeze(1)

    def to_grid(self, values: Tensor, at: Tensor) -> Tensor:
        """[k, width-1]: ``values [n]`` (taken at stream positions ``at``) placed at their
        rows' columns on the shifted grid of ``token_logprobs``; 0 elsewhere."""
        k, width = self.shape
        grid = values.new_zeros(k, width)
        grid = grid.index_put((self.row[at], self.pos[at]), values)
        return grid[:, :-1].contiguous()  # a fresh tensor: FSDP2 hooks a forward method's outputs


def pack(input_ids: Tensor, attention_mask: Tensor) -> Packed:
    """The real tokens of right-padded ``input_ids [k, width]`` (``attention_mask`` 1 on them),
    as one stream. Raises if a row's real tokens are not a prefix (left padding or holes)."""
    keep = attention_mask != 0
    k, width = input_ids.shape
    lengths = keep.sum(-1)
    cols = torch.arange(width, device=input_ids.device)
    if not torch.equal(keep, cols[None, :] < lengths[:, None]):
        raise ValueError("packing needs right-padded rows: attention_mask must be 1 then 0 per row")
    rows = torch.arange(k, device=input_ids.device).repeat_interleave(lengths)
    position = cols.expand(k, width)[keep]
    return Packed(input_ids[keep][None], position[None], rows, (k, width))


def document_mask(packed: Packed, attn: str | None, dtype: torch.dtype):
    """The attention mask of ``packed`` for transformers' ``attn`` implementation (see the
    module docstring); None for flash_attention_2 (it reads the position ids)."""
    attn = attn or "sdpa"
    if attn == "flash_attention_2":
        return None
    row = packed.row
    if attn == "flex_attention":
        from torch.nn.attention.flex_attention import create_block_mask

        def same_row_causal(b, h, q, kv):
            return (row[q] == row[kv]) & (kv <= q)

        s = row.numel()
        return create_block_mask(same_row_causal, None, None, s, s, device=row.device)
    allowed = (row[:, None] == row[None, :]).tril()  # [S, S]: same row, not after
    if attn == "sdpa":
        return allowed[None, None]
    if attn == "eager":
        blocked = torch.finfo(dtype).min
        return torch.zeros(allowed.shape, dtype=dtype, device=row.device).masked_fill_(
            ~allowed, blocked
        )[None, None]
    raise ValueError(f"packed sequences need one of {PACKED_ATTENTION}, not attention {attn!r}")


def packed_forward(body, packed: Packed):
    """``body`` (an HF base model or causal LM) on the stream, with its document mask."""
    attn = getattr(body.config, "_attn_implementation", None)
    dtype = next(body.parameters()).dtype
    mask = document_mask(packed, attn, dtype)
    return body(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=mask)


def set_packed(model, packed: bool) -> None:
    """Run ``model``'s forwards in ``token_logprobs`` / the critic on packed streams; an
    error if its attention (that of its first submodule with an HF config) cannot."""
    if packed:
        config = next(m.config for m in model.modules() if hasattr(m, "config"))
        attn = getattr(config, "_attn_implementation", None) or "sdpa"
        if attn not in PACKED_ATTENTION:
            raise ValueError(f"packed sequences need attention in {PACKED_ATTENTION}, not {attn!r}")
        if attn == "flex_attention":
            compile_without_pickled_caches()
    setattr(model, _ATTR, bool(packed))


def compile_without_pickled_caches() -> None:
    """flex_attention runs through ``torch.compile`` (transformers compiles it), whose on-disk
    caches of compiled graphs are pickles under the temp directory. asyncrl unpickles nothing
    (asyncrl/core/net/wireguard.py: a file there could run code), so this process compiles its
    kernels afresh instead of reading them back (seconds, once per process and shape)."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = False
    functorch_config.enable_autograd_cache = False


def is_packed(model) -> bool:
    return bool(getattr(model, _ATTR, False))
