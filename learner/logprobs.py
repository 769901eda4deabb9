"""Token log-probs and entropy from final hidden states, a chunk of positions at a time.

The head's logits ``z = h W^T`` are ``[N, V]``: at a 151,936-token vocabulary, float32, they
are 0.6 MB per position, and the plain path (``log_softmax`` of the whole ``[B, L, V]``)
keeps several such tensors for backward. Here only one chunk of ``chunk`` positions has
logits at any time, in forward and in backward: the forward keeps ``h`` and one
log-sum-exp per position, and the backward recomputes each chunk's logits (one more matmul
of the head, the price of never storing them). Peak memory is ``O(chunk * V)``, not
``O(N * V)``.

Per position, with float32 logits ``z`` (the head's output in its compute dtype, upcast as
the plain path does), target ``y``, ``log p = z - logsumexp(z)`` and ``H = -sum p log p``:
  logprob ``log p_y``, gradient ``d/dz = onehot(y) - p``;
  entropy ``H``,       gradient ``d/dz = -p * (log p + H)``.
No temperature: the learner scores the model's raw distribution, as the plain path does.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F


def chunked_token_logprobs(
    hidden: Tensor, weight: Tensor, targets: Tensor, chunk: int, entropy: bool = True
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of each target and (when ``entropy``) the entropy, ``chunk`` positions at a time.

    Args:
        hidden: [N, H] final hidden states (after the final norm), the head's input.
        weight: [V, H] the output head's weight (no bias).
        targets: [N] int64 token ids scored at each position.
        chunk: positions per chunk (>= 1); two ``[chunk, V]`` float32 tensors at a time.
    Returns:
        (logprobs [N], entropy [N] or None), float32 (float64 for a float64 model).
        Differentiable w.r.t. ``hidden`` and ``weight`` (gradients in their dtypes); the
        entropy's gradient is computed only when the entropy is used in the loss.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    logprobs, ent = _ChunkedHead.apply(hidden, weight, targets, chunk, entropy)
    return logprobs, (ent if entropy else None)


def _logits(hidden: Tensor, weight: Tensor) -> Tensor:
    """[c, V] logits of one chunk as the plain path computes them: ``lm_head`` in the compute
    dtype, then upcast to float32 (float64 stays float64); a fresh tensor, free to modify."""
    z = F.linear(hidden, weight)
    return z.to(_score_dtype(z.dtype))


def _score_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _spans(n: int, chunk: int) -> list[tuple[int, int]]:
    return [(s, min(s + chunk, n)) for s in range(0, n, chunk)]


class _ChunkedHead(torch.autograd.Function):
    """``(hidden, weight, targets) -> (logprobs, entropy)`` without an ``[N, V]`` tensor."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk, with_entropy):
        n = hidden.shape[0]
        logprobs = torch.empty(n, dtype=_score_dtype(hidden.dtype), device=hidden.device)
        lse = torch.empty_like(logprobs)
        ent = torch.empty_like(logprobs) if with_entropy else logprobs.new_empty(0)
        for s, e in _spans(n, chunk):
            # log_softmax's own formula, in place: two [c, V] tensors at most
            logp = _logits(hidden[s:e], weight)
            top = logp.amax(-1, keepdim=True)
            logp.sub_(top)
            tmp = torch.exp(logp)
            log_sum = tmp.sum(-1, keepdim=True).log_()
            logp.sub_(log_sum)
            lse[s:e] = (top + log_sum).squeeze(1)
            logprobs[s:e] = logp.gather(1, targets[s:e, None]).squeeze(1)
            if with_entropy:
                ent[s:e] = -torch.exp(logp, out=tmp).mul_(logp).sum(-1)
        if not with_entropy:
            ctx.mark_non_differentiable(ent)
        ctx.save_for_backward(hidden, weight, targets, lse, ent)
        ctx.chunk = chunk
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None
        return logprobs, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        hidden, weight, targets, lse, ent = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[:2]
        if ent.numel() == 0:
            g_ent = None
        if g_lp is None and g_ent is None:
            return None, None, None, None, None
        grad_h = torch.empty_like(hidden) if need_h else None
        # summed over chunks in float32 (or wider), cast to the weight's dtype at the end
        grad_w = torch.zeros_like(weight, dtype=_score_dtype(weight.dtype)) if need_w else None
        for s, e in _spans(hidden.shape[0], ctx.chunk):
            h = hidden[s:e]
            logp = _logits(h, weight).sub_(lse[s:e, None])  # [c, V] log p
            p = logp.exp()
            if g_ent is not None:  # g = g_ent * (-p (log p + H)), built in logp's memory
                g = logp.add_(ent[s:e, None]).mul_(p).mul_(-g_ent[s:e, None])
                if g_lp is not None:
                    g.sub_(p.mul_(g_lp[s:e, None]))
            else:
                g = p.mul_(-g_lp[s:e, None])
            if g_lp is not None:  # + g_lp * onehot(y)
                rows = torch.arange(e - s, device=g.device)
                g.index_put_((rows, targets[s:e]), g_lp[s:e], accumulate=True)
            g = g.to(hidden.dtype)
            if need_h:
                grad_h[s:e] = g @ weight
            if need_w and g.dtype == grad_w.dtype:
                grad_w.addmm_(g.t(), h)  # no [V, H] temporary
            elif need_w:  # 16-bit head: its product, summed in float32
                grad_w += g.t() @ h
        return grad_h, (grad_w.to(weight.dtype) if need_w else None), None, None, None
