"""Packed sequences (learner/compute/packing.py): a micro-batch's rows as one stream of real tokens with
a document mask. Each row's log-probs, entropy, values and gradients must be those of running
the row ALONE (not only those of the padded batch), in float64, for every attention the CPU
can run: sdpa and eager with gradients, flex_attention forward only (torch has no CPU
backward for it). The whole packed step against the padded one is in test_step_buckets.py;
tests/gpu/test_packing_gpu.py checks flex_attention and flash-attn with gradients on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from asyncrl.learner.compute.critic import ValueModel
from asyncrl.learner.compute.model import (
    attention_impl,
    resolve_packing,
    set_logprob_chunk_tokens,
    token_logprobs,
)
from asyncrl.learner.compute.packing import document_mask, pack, set_packed
from tests.unit.learner.test_logprobs import batch, tiny_qwen


def test_pack_keeps_real_tokens_restarts_positions_and_scores_within_rows():
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 1, 2], [3, 0, 0, 0]])
    mask = (torch.arange(4) < torch.tensor([[3], [4], [1]])).long()
    p = pack(ids, mask)
    assert p.input_ids.tolist() == [[5, 6, 7, 8, 9, 1, 2, 3]]
    assert p.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3, 0]]
    assert p.row.tolist() == [0, 0, 0, 1, 1, 1, 1, 2]
    at = p.scored()  # a row's last token scores nothing (its next token is another row's)
    assert at.tolist() == [0, 1, 3, 4, 5]
    grid = p.to_grid(torch.arange(1.0, 6.0), at)
    assert grid.tolist() == [[1, 2, 0], [3, 4, 5], [0, 0, 0]]


def test_pack_refuses_left_padding_or_holes():
    ids = torch.ones(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="right-padded rows"):
        pack(ids, torch.tensor([[1, 1, 1], [0, 1, 1]]))


def test_document_masks_allow_exactly_the_own_rows_past():
    p = pack(torch.ones(2, 3, dtype=torch.long), torch.tensor([[1, 1, 0], [1, 1, 1]]))
    want = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0],
                         [0, 0, 1, 1, 1]], dtype=torch.bool)  # fmt: skip
    assert torch.equal(document_mask(p, "sdpa", torch.float32)[0, 0], want)
    eager = document_mask(p, "eager", torch.float32)[0, 0]
    assert torch.equal(eager == 0, want) and bool((eager[~want] < -1e30).all())
    assert document_mask(p, "flash_attention_2", torch.float32) is None
    block = document_mask(p, "flex_attention", torch.float32)
    for q in range(5):
        for kv in range(5):
            allowed = bool(block.mask_mod(0, 0, torch.tensor(q), torch.tensor(kv)))
            assert allowed == bool(want[q, kv]), (q, kv)


def alone(model, ids, mask):
    """Each row run by itself (batch of 1, trimmed to its length), on the [B, L-1] grid."""
    lp_rows, ent_rows = [], []
    for r in range(ids.shape[0]):
        n = int(mask[r].sum())
        lp, ent = token_logprobs(model, ids[r : r + 1, :n], mask[r : r + 1, :n])
        pad = ids.shape[1] - n
        lp_rows.append(torch.nn.functional.pad(lp, (0, pad)))
        ent_rows.append(torch.nn.functional.pad(ent, (0, pad)))
    return torch.cat(lp_rows), torch.cat(ent_rows)


def _grads(model, lp, ent, w_lp, w_ent):
    model.zero_grad(set_to_none=True)
    ((lp * w_lp).sum() + (ent * w_ent).sum()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("chunk", [3, 0], ids=["chunked", "full_logits"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_rows_score_as_if_each_ran_alone(attn, chunk):
    torch.set_num_threads(1)
    ids, mask, w_lp, w_ent = batch()
    model = tiny_qwen(tie=False)
    model.config._attn_implementation = attn
    set_logprob_chunk_tokens(model, chunk)
    want_lp, want_ent = alone(model, ids, mask)
    want = _grads(model, want_lp, want_ent, w_lp, w_ent)
    set_packed(model, True)
    lp, ent = token_logprobs(model, ids, mask)
    # float64 weights, but transformers computes the rotary angles in float32 (~1e-9 apart
    # here) and eager attention's softmax in float32 (~1e-7); a leak is ~1e-3 (below)
    tol = {"rtol": 1e-5, "atol": 1e-6} if attn == "eager" else {"rtol": 1e-7, "atol": 1e-8}
    torch.testing.assert_close(lp, want_lp, **tol)
    torch.testing.assert_close(ent, want_ent, **tol)
    got = _grads(model, lp, ent, w_lp, w_ent)
    for name, g in want.items():
        torch.testing.assert_close(got[name], g, **tol, msg=name)
    # not vacuous: the same stream with a plain causal mask lets rows see each other
    set_packed(model, False)
    packed = pack(ids, mask)
    ones = torch.ones_like(packed.input_ids)  # a 2-D mask: transformers adds no document mask
    leaky = model(input_ids=packed.input_ids, position_ids=packed.position_ids,
                  attention_mask=ones).logits  # fmt: skip
    at = packed.scored()
    lp_leak = torch.log_softmax(leaky[0, at], -1).gather(-1, packed.input_ids[0, at + 1, None])
    leak = packed.to_grid(lp_leak[:, 0], at).detach() - want_lp.detach()
    assert float(leak.abs().max()) > 1e-3


def test_packed_flex_attention_forward_matches_each_row_alone():
    """Forward only: flex_attention has no CPU backward (torch raises NotImplementedError);
    the GPU test covers the backward. float32: flex's CPU kernel is compiled by inductor."""
    torch.set_num_threads(1)
    ids, mask, _, _ = batch()
    model = tiny_qwen(tie=True, dtype=torch.float32).eval()
    with torch.no_grad():
        want_lp, want_ent = alone(model, ids, mask)
        model.config._attn_implementation = "flex_attention"
        set_packed(model, True)
        lp, ent = token_logprobs(model, ids, mask)
    torch.testing.assert_close(lp, want_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, want_ent, rtol=1e-5, atol=1e-5)


def test_packed_critic_values_match_the_padded_ones_on_scored_positions():
    torch.set_num_threads(1)
    ids, mask, w, _ = batch()
    body = tiny_qwen(tie=False).model
    critic = ValueModel(body, body.config.hidden_size)
    torch.nn.init.normal_(critic.head.weight)  # the zero head would make every value 0
    scored = (mask[:, 1:] != 0).double()
    want = critic(ids, mask) * scored
    (want * w).sum().backward()
    want_grads = {n: p.grad.clone() for n, p in critic.named_parameters()}
    critic.zero_grad(set_to_none=True)
    set_packed(critic, True)
    got = critic(ids, mask)
    torch.testing.assert_close(got * scored, want, rtol=1e-7, atol=1e-8)
    # a row's last real position (no next token in its row) holds 0, as padding does
    assert float((got * (1 - scored)).abs().max()) == 0
    (got * w * scored).sum().backward()
    for name, p in critic.named_parameters():
        torch.testing.assert_close(p.grad, want_grads[name], rtol=1e-6, atol=1e-8, msg=name)


def test_packing_auto_is_on_a_gpu_with_a_budget_and_picks_flex_attention_there():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert resolve_packing(None, 16384, cuda) and not resolve_packing(None, 0, cuda)
    assert not resolve_packing(None, 16384, cpu) and resolve_packing(True, 64, cpu)
    assert not resolve_packing(False, 16384, cuda)
    assert attention_impl("auto", "float32", cuda, packed=True) == "flex_attention"
    assert attention_impl("auto", "float32", cpu, packed=True) is None  # sdpa
    assert attention_impl("sdpa", "bfloat16", cuda, packed=True) == "sdpa"


def test_an_attention_that_cannot_pack_is_refused():
    model = tiny_qwen(tie=True)
    model.config._attn_implementation = "paged|sdpa"
    with pytest.raises(ValueError, match="packed sequences need attention in"):
        set_packed(model, True)
