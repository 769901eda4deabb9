"""Chunked log-probs and entropy (learner/compute/logprobs.py via ``token_logprobs``) against the
closed form on full logits: same values and the same gradient w.r.t. every parameter, in
float64, tied and untied heads, with and without per-layer gradient checkpointing; and no
tensor of ``B x L x V`` elements ever exists. Gradient checkpointing of the critic's body.
The two-rank FSDP2 version is tests/unit/learner/test_logprobs_fsdp.py."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from asyncrl.learner.compute.logprobs import chunked_token_logprobs
from asyncrl.learner.compute.model import (
    enable_gradient_checkpointing,
    set_logprob_chunk_tokens,
    token_logprobs,
)

VOCAB = 50


def tiny_qwen(tie: bool, vocab: int = VOCAB, hidden: int = 16, dtype=torch.float64):
    """A random 2-layer Qwen2 (seeded: the same weights on every call), train mode."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, tie_word_embeddings=tie,
                      use_cache=False)  # fmt: skip
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).to(dtype).train()


def batch(rows: int = 4, length: int = 9, vocab: int = VOCAB):
    """Right-padded ids and mask (one full row, the others of lengths 6, 3, 8, ...), and two
    random weightings of the [rows, length-1] grid for a loss ``w_lp . lp + w_ent . H``."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (rows, length), generator=g)
    mask = torch.ones_like(ids)
    for r, n in enumerate([length, 6, 3, 8][:rows]):
        mask[r, n:] = 0
    ids = ids * mask  # padding is token 0, as learner/compute/batch.py pads
    w_lp, w_ent = torch.randn(2, rows, length - 1, generator=g, dtype=torch.float64)
    return ids, mask, w_lp, w_ent


def reference(model, ids, mask):
    """The closed form: log_softmax of the model's full [B, L, V] logits; 0 where the scored
    token is padding (the contract of ``token_logprobs``); 16-bit logits upcast first."""
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
    lp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    scored = mask[:, 1:] != 0
    return torch.where(scored, lp, 0), torch.where(scored, ent, 0)


def count_layer_calls(model) -> list[int]:
    """A list that counts the decoder layers' forward calls, recomputes included (a pre-hook:
    the recompute stops once it has rebuilt what backward needs, before the layer's end)."""
    calls = [0]
    for layer in getattr(model, "model", model).layers:
        layer.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def values_and_grads(model, fn, ids, mask, w_lp, w_ent, use_entropy=True):
    model.zero_grad(set_to_none=True)
    lp, ent = fn(model, ids, mask)
    loss = (lp * w_lp).sum() + ((ent * w_ent).sum() if use_entropy else 0)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return lp.detach(), ent.detach(), grads


def assert_same(got, want, rtol=1e-10, atol=1e-12):
    for name, g, w in [("logprobs", got[0], want[0]), ("entropy", got[1], want[1])]:
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, msg=name)
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], rtol=rtol, atol=atol, msg=name)
    assert any(float(g.abs().max()) > 1e-3 for g in want[2].values()), "vacuous: no gradient"


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("chunk", [1, 5, 1000])
def test_chunked_matches_full_logits(tie, checkpointing, chunk):
    ids, mask, w_lp, w_ent = batch()
    want = values_and_grads(tiny_qwen(tie), reference, ids, mask, w_lp, w_ent)
    model = tiny_qwen(tie)
    if checkpointing:
        enable_gradient_checkpointing(model)
    calls = count_layer_calls(model)
    chunked = lambda m, i, a: token_logprobs(m, i, a, chunk_tokens=chunk)  # noqa: E731
    assert_same(values_and_grads(model, chunked, ids, mask, w_lp, w_ent), want)
    assert calls[0] == 2 * (2 if checkpointing else 1)  # 2 layers, recomputed in backward
    if tie:
        assert model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.parametrize("use_entropy", [True, False], ids=["entropy_in_loss", "logprobs_only"])
def test_fused_head_matches_full_logits(use_entropy):
    """``model.compile``'s head (``set_logprob_fused``: the per-chunk math through
    ``torch.compile``): the closed form's values and gradients, in float64, over chunks of
    uneven size (5, 5, ..., then the rest: the dynamic-shape recompile); with the entropy in
    the loss (both gradient terms) and without it (the log-probs' alone)."""
    from asyncrl.learner.compute.logprobs import set_logprob_fused

    torch._dynamo.reset()
    ids, mask, w_lp, w_ent = batch()
    want = values_and_grads(tiny_qwen(True), reference, ids, mask, w_lp, w_ent, use_entropy)
    model = tiny_qwen(True)
    set_logprob_fused(model, True)
    fused = lambda m, i, a: token_logprobs(m, i, a, chunk_tokens=5)  # noqa: E731
    got = values_and_grads(model, fused, ids, mask, w_lp, w_ent, use_entropy)
    assert_same(got, want, rtol=1e-9, atol=1e-11)


def test_full_logits_path_is_the_same():
    """``chunk_tokens=0`` (the escape hatch, and the path of models outside
    ``_PLAIN_HEAD_MODELS``) keeps the contract too."""
    ids, mask, w_lp, w_ent = batch()
    want = values_and_grads(tiny_qwen(False), reference, ids, mask, w_lp, w_ent)
    full = lambda m, i, a: token_logprobs(m, i, a, chunk_tokens=0)  # noqa: E731
    assert_same(values_and_grads(tiny_qwen(False), full, ids, mask, w_lp, w_ent), want)


def test_entropy_detached_or_skipped():
    """Entropy not in the loss (``entropy_coef == 0``): the gradient is the log-probs' alone,
    whether the entropy was computed (for the metric) or skipped (``entropy=False``)."""
    ids, mask, w_lp, w_ent = batch()
    want = values_and_grads(tiny_qwen(False), reference, ids, mask, w_lp, w_ent, False)
    model = tiny_qwen(False)
    kept = values_and_grads(model, token_logprobs, ids, mask, w_lp, w_ent, False)
    assert_same(kept, want)

    def no_entropy(m, i, a):
        lp, ent = token_logprobs(m, i, a, entropy=False)
        assert ent is None
        return lp, torch.zeros_like(lp)

    got = values_and_grads(model, no_entropy, ids, mask, w_lp, w_ent, False)
    assert_same((got[0], want[1], got[2]), want)


def test_chunk_size_from_the_model(monkeypatch):
    """``set_logprob_chunk_tokens`` (what build_policy does with ``model.logprob_chunk_tokens``)
    is the default of ``token_logprobs``."""
    import asyncrl.learner.compute.logprobs

    sizes = []

    def spy(hidden, weight, targets, chunk, *args):
        sizes.append(chunk)
        return chunked_token_logprobs(hidden, weight, targets, chunk, *args)

    monkeypatch.setattr(asyncrl.learner.compute.logprobs, "chunked_token_logprobs", spy)
    model = tiny_qwen(False)
    ids, mask, _, _ = batch()
    token_logprobs(model, ids, mask)
    set_logprob_chunk_tokens(model, 3)
    token_logprobs(model, ids, mask)
    assert sizes == [1024, 3]  # ModelConfig's default, then the model's
    with pytest.raises(ValueError, match="logprob_chunk_tokens"):
        set_logprob_chunk_tokens(model, -1)


def test_bfloat16_matches_full_logits_within_rounding():
    """In bfloat16 the head runs in bf16 and is upcast before the softmax on both paths: the
    same values up to bf16 rounding (equal here; a wrong formula is off by O(1))."""
    ids, mask, w_lp, w_ent = batch()
    want = values_and_grads(
        tiny_qwen(False, dtype=torch.bfloat16), reference, ids, mask, w_lp, w_ent
    )
    got = values_and_grads(
        tiny_qwen(False, dtype=torch.bfloat16), token_logprobs, ids, mask, w_lp, w_ent
    )
    assert got[0].dtype == torch.float32
    torch.testing.assert_close(got[0], want[0].float(), rtol=0, atol=1e-3)
    torch.testing.assert_close(got[1], want[1].float(), rtol=0, atol=1e-3)
    for name, g in want[2].items():
        assert got[2][name].dtype == torch.bfloat16
        err = float((got[2][name].float() - g.float()).norm() / g.float().norm().clamp(min=1e-6))
        assert err < 1e-2, (name, err)


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor any op produced (forward and backward, autograd included)."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.bytes = max(self.bytes, t.numel() * t.element_size())
        return out


@pytest.mark.parametrize("checkpointing", [False, True])
def test_no_tensor_scales_with_batch_times_vocab(checkpointing):
    """Forward + backward with a vocabulary large against everything else: the full path
    makes [B, L-1, V] float32 tensors; the chunked one none larger than one chunk's logits."""
    vocab, chunk = 4096, 16
    model = tiny_qwen(True, vocab=vocab, hidden=8, dtype=torch.float32)
    if checkpointing:
        enable_gradient_checkpointing(model)
    ids, mask, w_lp, w_ent = batch(rows=4, length=33, vocab=vocab)
    logits_bytes = 4 * 32 * vocab * 4
    largest = {}
    for chunk_tokens in (0, chunk):
        with _LargestTensor() as seen:
            fn = lambda m, i, a: token_logprobs(m, i, a, chunk_tokens=chunk_tokens)  # noqa: E731,B023
            values_and_grads(model, fn, ids, mask, w_lp.float(), w_ent.float())
        largest[chunk_tokens] = seen.bytes
    assert largest[0] >= logits_bytes  # the measure sees the full path's logits
    assert largest[chunk] <= chunk * vocab * 4  # one chunk's float32 logits at most
    assert largest[chunk] * 8 <= logits_bytes


def test_critic_checkpointing_same_values_and_gradients(tiny_model):
    """``model.gradient_checkpointing`` also checkpoints the critic's body (learner/trainer.py):
    the same values and gradients, with the layers recomputed."""
    from asyncrl.learner.compute.critic import load_value_model

    ids, mask, w, _ = batch(vocab=32)
    runs = []
    for checkpointing in (False, True):
        critic = load_value_model(tiny_model).double().train()
        torch.manual_seed(0)
        torch.nn.init.normal_(critic.head.weight)  # zero-initialised: no gradient to the body
        if checkpointing:
            enable_gradient_checkpointing(critic.body)
        calls = count_layer_calls(critic.body)
        values = critic(ids, mask)
        (values * w).sum().backward()
        runs.append((values.detach(), {n: p.grad for n, p in critic.named_parameters()}, calls[0]))
    torch.testing.assert_close(runs[1][0], runs[0][0], rtol=1e-12, atol=1e-12)
    for name, g in runs[0][1].items():
        torch.testing.assert_close(runs[1][1][name], g, rtol=1e-10, atol=1e-12, msg=name)
    assert [r[2] for r in runs] == [2, 4]


def test_config_keys_reach_policy_critic_and_reference(tiny_model):
    """``model.gradient_checkpointing`` and ``model.logprob_chunk_tokens`` through the
    learner's own builder (``build_step_context``): every decoder layer of the policy and of
    the critic checkpoints, the reference does not (no backward), both use the chunk."""
    from asyncrl.core.config.load import load_config
    from asyncrl.learner.trainer import build_step_context

    keys = ["model.gradient_checkpointing=true", "model.logprob_chunk_tokens=7",
            "sampling.temperature=0.8"]  # fmt: skip
    cfg = load_config(["algorithm=ppo", *keys])  # gae: a critic; kl_coef > 0: a reference
    ctx = build_step_context(cfg, tiny_model, 0, 1)
    assert all(layer.gradient_checkpointing for layer in ctx.model.model.layers)
    assert all(layer.gradient_checkpointing for layer in ctx.critic.model.body.layers)
    assert not any(layer.gradient_checkpointing for layer in ctx.reference.model.layers)
    assert ctx.model.logprob_chunk_tokens == ctx.reference.logprob_chunk_tokens == 7
    assert ctx.model.logprob_temperature == ctx.reference.logprob_temperature == 0.8
    default = build_step_context(load_config(["algorithm=ppo"]), tiny_model, 0, 1)
    assert not any(layer.gradient_checkpointing for layer in default.model.model.layers)
    assert default.model.logprob_chunk_tokens == 1024
    assert default.model.logprob_temperature == 1.0


@pytest.mark.parametrize("chunk", [0, 5])
def test_the_learner_scores_at_the_actors_temperature(chunk):
    """pi_theta at ``sampling.temperature``: log_softmax(logits / T), on the chunked and the
    full-logits path, values and gradients (vLLM reports the tempered log-probs as pi_behave)."""
    from asyncrl.learner.compute.model import set_logprob_temperature

    temp = 0.7
    ids, mask, w_lp, w_ent = batch()

    def tempered(model, ids, mask):
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1] / temp
        logp = torch.log_softmax(logits, -1)
        lp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
        ent = -(logp.exp() * logp).sum(-1)
        scored = mask[:, 1:] != 0
        return torch.where(scored, lp, 0), torch.where(scored, ent, 0)

    want = values_and_grads(tiny_qwen(False), tempered, ids, mask, w_lp, w_ent)
    model = tiny_qwen(False)
    set_logprob_temperature(model, temp)
    got = values_and_grads(model, lambda m, i, a: token_logprobs(m, i, a, chunk_tokens=chunk),
                           ids, mask, w_lp, w_ent)  # fmt: skip
    assert_same(got, want)
    untempered = reference(tiny_qwen(False), ids, mask)[0]
    assert float((got[0] - untempered).abs().max()) > 1e-2, "vacuous: T changed nothing"
    with pytest.raises(ValueError, match="temperature must be > 0"):
        set_logprob_temperature(model, 0.0)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("chunk", [3, 0], ids=["chunked", "full_logits"])
def test_only_the_scored_positions_are_scored(monkeypatch, packed, chunk):
    """``scored`` (the loss mask: completion tokens) picks the positions: the same values
    there, 0 elsewhere, and only those positions go through the chunked head."""
    import asyncrl.learner.compute.logprobs
    from asyncrl.learner.compute.packing import set_packed

    heads = []

    def spy(hidden, *args, **kw):
        heads.append(hidden.shape[0])
        return chunked_token_logprobs(hidden, *args, **kw)

    monkeypatch.setattr(asyncrl.learner.compute.logprobs, "chunked_token_logprobs", spy)
    model = tiny_qwen(False)
    set_packed(model, packed)
    ids, mask, _, _ = batch()
    scored = torch.zeros(ids.shape[0], ids.shape[1] - 1)
    scored[:, 2:] = 1  # a 3-token "prompt": positions 0 and 1 score prompt tokens
    all_lp, all_ent = token_logprobs(model, ids, mask, chunk_tokens=chunk)
    lp, ent = token_logprobs(model, ids, mask, chunk_tokens=chunk, scored=scored)
    wanted = (scored != 0) & (mask[:, 1:] != 0)
    assert 0 < int(wanted.sum()) < int((mask[:, 1:] != 0).sum())
    for got, want in [(lp, all_lp), (ent, all_ent)]:
        torch.testing.assert_close(got, torch.where(wanted, want, 0.0), rtol=1e-12, atol=1e-12)
    if chunk:
        assert heads == [int((mask[:, 1:] != 0).sum()), int(wanted.sum())]


def test_no_position_to_score_gives_empty_results():
    """A micro-batch whose rows have no scored position (all prompt): empty log-probs and
    entropy, and a backward that leaves zero gradients."""
    hidden = torch.zeros(0, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(VOCAB, 8, dtype=torch.float64, requires_grad=True)
    lp, ent = chunked_token_logprobs(hidden, weight, torch.zeros(0, dtype=torch.long), 4)
    assert lp.shape == ent.shape == (0,) and lp.dtype == torch.float64
    (lp.sum() + ent.sum()).backward()
    assert weight.grad is None or not weight.grad.any()
