"""Packed sequences on a GPU (learner/compute/packing.py): each row's log-probs, entropy and gradients
in one packed stream against the row run alone, with flex_attention (its ``BlockMask``), sdpa
(dense boolean mask) and flash-attn's varlen kernel when flash-attn is installed; bfloat16
compute, rows longer than flex's 128-token blocks so blocks straddle rows. Skipped on machines
without a CUDA GPU; the CPU versions (float64, sdpa/eager, flex forward) are
tests/unit/learner/test_packing.py.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from asyncrl.learner.compute.model import token_logprobs
from asyncrl.learner.compute.packing import pack, set_packed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA GPU (torch.cuda.is_available() is False); runs on a GPU machine",
    ),
]

ATTENTION = ["flex_attention", "sdpa"] + (
    ["flash_attention_2"] if importlib.util.find_spec("flash_attn") else []
)
LENGTHS = [700, 129, 300, 5, 1000]


def model_and_rows(attn: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=1000, hidden_size=256, intermediate_size=512,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=2048, tie_word_embeddings=False,
                      use_cache=False, attn_implementation=attn)  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to("cuda", torch.bfloat16).train()
    width = max(LENGTHS)
    ids = torch.randint(1, 1000, (len(LENGTHS), width), device="cuda")
    mask = torch.arange(width, device="cuda")[None] < torch.tensor(LENGTHS, device="cuda")[:, None]
    return model, ids * mask, mask.long()


def _run(model, ids, mask, weights):
    lp, ent = token_logprobs(model, ids, mask)
    model.zero_grad(set_to_none=True)
    ((lp * weights).sum() + ent.sum() * 1e-2).backward()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters()}
    return lp.detach().float(), ent.detach().float(), grads


@pytest.mark.parametrize("attn", ATTENTION)
def test_packed_rows_on_a_gpu_score_as_if_each_ran_alone(attn):
    model, ids, mask = model_and_rows(attn)
    weights = torch.randn(ids.shape[0], ids.shape[1] - 1, device="cuda")
    alone_lp, alone_ent = torch.zeros_like(weights), torch.zeros_like(weights)
    model.zero_grad(set_to_none=True)
    for r, n in enumerate(LENGTHS):  # each row alone; gradients summed over rows
        lp, ent = token_logprobs(model, ids[r : r + 1, :n], mask[r : r + 1, :n])
        ((lp * weights[r : r + 1, : n - 1]).sum() + ent.sum() * 1e-2).backward()
        alone_lp[r, : n - 1], alone_ent[r, : n - 1] = lp[0].detach(), ent[0].detach()
    want = {n: p.grad.float().clone() for n, p in model.named_parameters()}
    set_packed(model, True)
    lp, ent, got = _run(model, ids, mask, weights)
    scored = mask[:, 1:].bool()
    err = float((lp - alone_lp)[scored].abs().max())
    assert err < 0.05 and float((ent - alone_ent)[scored].abs().max()) < 0.05, attn
    # not vacuous: the stream under a plain causal mask (rows see the rows before) is further
    set_packed(model, False)
    packed = pack(ids, mask)
    with torch.no_grad():
        logits = model(input_ids=packed.input_ids, position_ids=packed.position_ids,
                       attention_mask=torch.ones_like(packed.input_ids)).logits[0].float()  # fmt: skip
    at = packed.scored()
    leaky = torch.log_softmax(logits[at], -1).gather(-1, packed.input_ids[0, at + 1, None])
    leak = float((packed.to_grid(leaky[:, 0], at) - alone_lp)[scored].abs().max())
    assert leak > 4 * err, (attn, leak, err)
    for name, g in want.items():
        rel = float((got[name] - g).norm() / g.norm().clamp(min=1e-12))
        assert rel < 0.05, (attn, name, rel)
