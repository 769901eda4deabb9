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
No temperature here: ``token_logprobs`` divides the hidden states by it first.

Two implementations of the per-chunk math, same formulas: the eager one (default), in place,
at most two ``[c, V]`` float32 tensors; and the fused one (``fused=True``, ``model.compile``):
``_chunk_stats`` and ``_chunk_grad`` compiled by ``torch.compile`` into a few kernels that
read the head's 16-bit logits and write the 16-bit gradient, without the float32
intermediates the eager one passes through memory (about ten ``[c, V]`` passes each way; at
the 1.5B shape on an H200 these elementwise passes took as long as the step's matmuls).

``token_logprobs`` (below; re-exported by asyncrl.learner.compute.model) is the model-level entry: it runs the
body (padded rows, or a packed stream: learner/compute/packing.py), picks the positions to score, and
sends only those through the head (or takes the full-logits path for models whose logits are
more than ``lm_head(hidden)``).
"""

from __future__ import annotations

from types import MethodType

import torch
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method
from torch.nn import functional as F

from asyncrl.core.config.job import ModelConfig
from asyncrl.learner.compute.packing import is_packed, pack, packed_forward

_PLAIN_HEAD_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"})
"""HF model types whose causal-LM logits are ``lm_head(final hidden states)`` and nothing more
(read in transformers 5.19); the chunked ``token_logprobs`` rebuilds exactly that. Others
(Gemma's soft-capping, Cohere's and Granite's logit scales, ...) take the full-logits path."""
_CHUNK_ATTR = "logprob_chunk_tokens"  # set on the model by build_policy / build_reference
_TEMPERATURE_ATTR = "logprob_temperature"  # set_logprob_temperature
_ROOT_METHOD = "_asyncrl_hidden_logprobs"  # the FSDP2 forward method (_run_chunked)
_FUSED_ATTR = "logprob_fused"  # set_logprob_fused


def chunked_token_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    chunk: int,
    entropy: bool = True,
    fused: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of each target and (when ``entropy``) the entropy, ``chunk`` positions at a time.

    Args:
        hidden: [N, H] final hidden states (after the final norm), the head's input.
        weight: [V, H] the output head's weight (no bias).
        targets: [N] int64 token ids scored at each position.
        chunk: positions per chunk (>= 1); two ``[chunk, V]`` float32 tensors at a time.
        fused: the compiled per-chunk kernels (``_chunk_stats``, ``_chunk_grad``) instead of
            the eager in-place ones; same values up to float rounding.
    Returns:
        (logprobs [N], entropy [N] or None), float32 (float64 for a float64 model).
        Differentiable w.r.t. ``hidden`` and ``weight`` (gradients in their dtypes); the
        entropy's gradient is computed only when the entropy is used in the loss.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    logprobs, ent = _ChunkedHead.apply(hidden, weight, targets, chunk, entropy, fused)
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


# -- the per-chunk math: eager (in place) and pure (for torch.compile), same contract ---------


def _eager_stats(hidden: Tensor, weight: Tensor, targets: Tensor, with_entropy: bool):
    """One chunk's ``(log p_y [c], logsumexp [c], entropy [c] or empty)``: log_softmax's own
    formula in place, two [c, V] float32 tensors at most."""
    logp = _logits(hidden, weight)
    top = logp.amax(-1, keepdim=True)
    logp.sub_(top)
    tmp = torch.exp(logp)
    total = tmp.sum(-1, keepdim=True)
    log_sum = total.log()
    logp.sub_(log_sum)
    lp = logp.gather(1, targets[:, None]).squeeze(1)
    lse = (top + log_sum).squeeze(1)
    if not with_entropy:
        return lp, lse, lp.new_empty(0)
    return lp, lse, -tmp.div_(total).mul_(logp).sum(-1)  # p: the softmax's own exp, reused


def _eager_grad(hidden, weight, targets, lse, ent, g_lp, g_ent) -> Tensor:
    """d loss / d z [c, V] of one chunk in ``hidden``'s dtype, built in the logits' memory:
    ``g_lp (onehot(y) - p)`` plus ``-g_ent p (log p + H)``; ``g_lp`` / ``g_ent`` [c] or None."""
    logp = _logits(hidden, weight).sub_(lse[:, None])  # [c, V] log p
    p = logp.exp()
    if g_ent is not None:
        g = logp.add_(ent[:, None]).mul_(p).mul_(-g_ent[:, None])
        if g_lp is not None:
            g.sub_(p.mul_(g_lp[:, None]))
    else:
        g = p.mul_(-g_lp[:, None])
    if g_lp is not None:  # + g_lp * onehot(y)
        rows = torch.arange(g.shape[0], device=g.device)
        g.index_put_((rows, targets), g_lp, accumulate=True)
    return g.to(hidden.dtype)


def _chunk_stats(z: Tensor, targets: Tensor, with_entropy: bool):
    """``_eager_stats`` from the chunk's logits ``z [c, V]`` (any float dtype, upcast), pure."""
    zf = z.to(_score_dtype(z.dtype))
    lse = torch.logsumexp(zf, -1)
    lp = zf.gather(1, targets[:, None]).squeeze(1) - lse
    if not with_entropy:
        return lp, lse, lp.new_empty(0)
    logp = zf - lse[:, None]
    return lp, lse, -(logp.exp() * logp).sum(-1)


def _chunk_grad(z: Tensor, targets: Tensor, lse: Tensor, ent: Tensor, g_lp, g_ent, dtype):
    """``_eager_grad`` from the chunk's logits ``z [c, V]``, in ``dtype``, pure."""
    logp = z.to(_score_dtype(z.dtype)) - lse[:, None]
    p = logp.exp()
    g = torch.zeros_like(p)
    if g_ent is not None:
        g = g - g_ent[:, None] * p * (logp + ent[:, None])
    if g_lp is not None:
        vocab = torch.arange(z.shape[1], device=z.device)
        g = g + g_lp[:, None] * ((vocab[None, :] == targets[:, None]).to(p.dtype) - p)
    return g.to(dtype)


_COMPILED: dict[str, object] = {}


def _compiled(fn):
    """``torch.compile(fn)``, once a process (torch's on-disk caches of pickled graphs off:
    ``asyncrl.learner.compute.packing.compile_without_pickled_caches``)."""
    if fn.__name__ not in _COMPILED:
        from asyncrl.learner.compute.packing import compile_without_pickled_caches

        compile_without_pickled_caches()
        _COMPILED[fn.__name__] = torch.compile(fn, dynamic=None)
    return _COMPILED[fn.__name__]


def _stats_of(fused: bool):
    """``(hidden, weight, targets, with_entropy) -> (lp, lse, ent)`` of one chunk."""
    if not fused:
        return _eager_stats
    stats = _compiled(_chunk_stats)
    return lambda h, w, y, with_entropy: stats(F.linear(h, w), y, with_entropy)


def _grad_of(fused: bool):
    """``(hidden, weight, targets, lse, ent, g_lp, g_ent) -> d loss / d z`` of one chunk."""
    if not fused:
        return _eager_grad
    grad = _compiled(_chunk_grad)
    return lambda h, w, *rest: grad(F.linear(h, w), *rest, h.dtype)


class _ChunkedHead(torch.autograd.Function):
    """``(hidden, weight, targets) -> (logprobs, entropy)`` without an ``[N, V]`` tensor; the
    per-chunk math eager or compiled (``fused``)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk, with_entropy, fused):
        stats, spans = _stats_of(fused), _spans(hidden.shape[0], chunk)
        parts = [stats(hidden[s:e], weight, targets[s:e], with_entropy) for s, e in spans]
        if parts:
            logprobs, lse, ent = (torch.cat(x) for x in zip(*parts, strict=True))
        else:  # no position to score
            logprobs = lse = hidden.new_empty(0, dtype=_score_dtype(hidden.dtype))
            ent = logprobs.new_empty(0)
        if not with_entropy:
            ctx.mark_non_differentiable(ent)
        ctx.save_for_backward(hidden, weight, targets, lse, ent)
        ctx.chunk, ctx.fused = chunk, fused
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None
        return logprobs, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        hidden, weight, targets, lse, ent = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[:2]
        if ent.numel() == 0:
            g_ent = None
        if g_lp is None and g_ent is None:
            return None, None, None, None, None, None
        grad_of = _grad_of(ctx.fused)
        grad_h = torch.empty_like(hidden) if need_h else None
        # summed over chunks in float32 (or wider), cast to the weight's dtype at the end
        grad_w = torch.zeros_like(weight, dtype=_score_dtype(weight.dtype)) if need_w else None
        for s, e in _spans(hidden.shape[0], ctx.chunk):
            h = hidden[s:e]
            part = [None if g is None else g[s:e] for g in (g_lp, g_ent)]
            g = grad_of(h, weight, targets[s:e], lse[s:e], ent[s:e], *part)
            if need_h:
                grad_h[s:e] = g @ weight
            if need_w and g.dtype == grad_w.dtype:
                grad_w.addmm_(g.t(), h)  # no [V, H] temporary
            elif need_w:  # 16-bit head: its product, summed in float32
                grad_w += g.t() @ h
        grad_w = grad_w.to(weight.dtype) if need_w else None
        return grad_h, grad_w, None, None, None, None


def set_logprob_fused(model: nn.Module, fused: bool) -> None:
    """``token_logprobs(model, ...)`` runs the chunked head's compiled kernels (``fused``;
    ``model.compile`` sets it) or its eager in-place ones."""
    setattr(model, _FUSED_ATTR, bool(fused))


def set_logprob_chunk_tokens(model: nn.Module, tokens: int | None) -> None:
    """``token_logprobs(model, ...)``'s positions per chunk of the head (None = the config
    default; 0 = the full ``[B, L, V]`` logits at once)."""
    if tokens is not None and tokens < 0:
        raise ValueError(f"logprob_chunk_tokens must be >= 0, got {tokens}")
    setattr(model, _CHUNK_ATTR, ModelConfig.logprob_chunk_tokens if tokens is None else tokens)


def set_logprob_temperature(model: nn.Module, temperature: float) -> None:
    """Score ``model``'s distribution at ``temperature`` (logits / T) in ``token_logprobs``.

    The actors sample at ``sampling.temperature`` and report the log-probs of the tempered
    distribution (vLLM ``logprobs_mode="processed_logprobs"``), so pi_theta must be tempered
    alike or the importance ratio pi_theta / pi_behave compares two different distributions
    (verl divides its logits by the rollout temperature the same way). The actors sample
    without top-p/top-k (actors/engine/vllm_engine.py), so nothing else separates the two."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    setattr(model, _TEMPERATURE_ATTR, float(temperature))


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    entropy: bool = True,
    chunk_tokens: int | None = None,
    scored: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each next token and the per-position entropy.

    The final hidden states go through the head ``chunk_tokens`` positions at a time, in
    forward and in backward (``asyncrl.learner.compute.logprobs``), so no ``[B, L, V]`` tensor is built;
    positions whose target is padding are skipped. ``chunk_tokens=0``, or a model whose
    logits are more than ``lm_head(hidden)`` (``_PLAIN_HEAD_MODELS``), takes the full-logits
    path: same values, with ``B * L * V`` memory. Collective under FSDP2.

    Args:
        input_ids: [B, L] right-padded sequences (prompt + completion).
        attention_mask: [B, L] 1 on real tokens.
        entropy: False skips the entropy (returned as None).
        chunk_tokens: positions per chunk; None = the model's (``set_logprob_chunk_tokens``,
            default ``ModelConfig.logprob_chunk_tokens``).
        scored: [B, L-1] nonzero at the positions wanted (the loss mask: completion tokens);
            None = every position whose target is real. Others are 0 and cost no head work.
    Returns:
        (logprobs [B, L-1], entropy [B, L-1] or None), float32; position t scores token
        ``input_ids[:, t+1]``; 0 where that token is padding (``attention_mask[:, t+1] == 0``)
        or not ``scored``.
    """
    if chunk_tokens is None:
        chunk_tokens = getattr(model, _CHUNK_ATTR, ModelConfig.logprob_chunk_tokens)
    temperature = getattr(model, _TEMPERATURE_ATTR, 1.0)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    wanted = attention_mask[:, 1:] != 0
    if scored is not None:
        wanted = wanted & (scored != 0)
    if chunk_tokens == 0 or model_type not in _PLAIN_HEAD_MODELS:
        return _full_logits_logprobs(model, input_ids, attention_mask, entropy, temperature, wanted)
    return _run_chunked(
        model, input_ids, attention_mask, chunk_tokens, entropy, temperature, wanted
    )


def _full_logits_logprobs(model, input_ids, attention_mask, entropy, temperature, wanted):
    """The plain path: ``model(...).logits`` ([B, L, V]) and ``log_softmax`` over all of it;
    0 off ``wanted [B, L-1]``."""
    if is_packed(model):
        return _packed_full_logits(model, input_ids, attention_mask, entropy, temperature, wanted)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
    logprobs = logp_all.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    scored, zero = wanted, logprobs.new_zeros(())
    if not entropy:
        return torch.where(scored, logprobs, zero), None
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return torch.where(scored, logprobs, zero), torch.where(scored, ent, zero)


def _packed_full_logits(model, input_ids, attention_mask, entropy, temperature, wanted):
    """``_full_logits_logprobs`` on the packed stream (``asyncrl.learner.compute.packing``): ``[S, V]`` logits,
    scored where the next token is in the same row and the position is ``wanted``."""
    packed = pack(input_ids, attention_mask)
    at = _wanted(packed, wanted)
    logits = packed_forward(model, packed).logits[0, at]
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
    targets = packed.input_ids[0, at + 1]
    logprobs = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1) if entropy else None
    return packed.to_grid(logprobs, at), (None if ent is None else packed.to_grid(ent, at))


def _run_chunked(model, *args):
    """``_hidden_logprobs(model, *args)``; on an FSDP2 root, as a registered FSDP forward method.

    ``shard_model`` leaves the embeddings, the final norm and the head (tied or not) to the
    root's FSDP unit, whose hooks gather them only around ``model.forward``. Outside it,
    ``model.model`` and ``lm_head.weight`` are sharded DTensors. ``register_fsdp_forward_method``
    runs the root's pre/post-forward hooks around ``_hidden_logprobs`` as around ``forward``:
    the root's parameters are gathered (in the compute dtype), the head weight the chunks
    read is the unsharded parameter the autograd graph then holds, the pre-backward hook
    re-gathers it for the backward's recompute of the chunks, and the head's gradient is
    reduce-scattered with the rest of the root's at the end of backward. Registered once per
    model, on its first call.
    """
    if not isinstance(model, FSDPModule):
        return _hidden_logprobs(model, *args)
    if _ROOT_METHOD not in vars(model):
        setattr(model, _ROOT_METHOD, MethodType(_hidden_logprobs, model))
        register_fsdp_forward_method(model, _ROOT_METHOD)
    return getattr(model, _ROOT_METHOD)(*args)


def _hidden_logprobs(model, input_ids, attention_mask, chunk_tokens, entropy, temperature, wanted):
    """``token_logprobs`` from the final hidden states: only the ``wanted`` positions (whose
    target is a real token) go through the head; the rest of the [B, L-1] grid is 0.
    ``(h / T) W^T`` is the tempered logits ``z / T`` exactly (no bias in these heads)."""
    if is_packed(model):
        return _packed_hidden_logprobs(
            model, input_ids, attention_mask, chunk_tokens, entropy, temperature, wanted
        )
    b, length = input_ids.shape
    out = model.base_model(input_ids=input_ids, attention_mask=attention_mask)
    hidden = out.last_hidden_state.flatten(0, 1)  # [B*L, H], after the final norm
    scored = torch.zeros_like(input_ids, dtype=torch.bool)
    scored[:, :-1] = wanted
    idx = scored.flatten().nonzero().squeeze(1)  # flat (b, t); its target is at idx + 1
    weight = model.get_output_embeddings().weight
    targets = input_ids.flatten()[idx + 1]
    h = hidden[idx] if temperature == 1.0 else hidden[idx] / temperature
    fused = getattr(model, _FUSED_ATTR, False)
    lp, ent = chunked_token_logprobs(h, weight, targets, chunk_tokens, entropy, fused)

    def grid(values):  # [n] -> [B, L-1], 0 off ``idx``; a fresh tensor (FSDP hooks its outputs)
        full = values.new_zeros(b * length).index_copy(0, idx, values)
        return full.view(b, length)[:, :-1].contiguous()

    return grid(lp), (None if ent is None else grid(ent))


def _packed_hidden_logprobs(
    model, input_ids, attention_mask, chunk_tokens, entropy, temperature, wanted
):
    """``_hidden_logprobs`` on the packed stream: the head sees the ``wanted`` positions whose
    next token is in the same row."""
    packed = pack(input_ids, attention_mask)
    hidden = packed_forward(model.base_model, packed).last_hidden_state[0]  # [S, H]
    at = _wanted(packed, wanted)
    h = hidden[at] if temperature == 1.0 else hidden[at] / temperature
    weight = model.get_output_embeddings().weight
    targets, fused = packed.input_ids[0, at + 1], getattr(model, _FUSED_ATTR, False)
    lp, ent = chunked_token_logprobs(h, weight, targets, chunk_tokens, entropy, fused)
    return packed.to_grid(lp, at), (None if ent is None else packed.to_grid(ent, at))


def _wanted(packed, wanted: Tensor) -> Tensor:
    """The stream positions to score: next token in the same row, and ``wanted [k, width-1]``
    at the position's place in its row."""
    at = packed.scored()
    return at[wanted[packed.row[at], packed.pos[at]]]
