"""``model.compile``: each decoder layer's forward through ``torch.compile`` gives the eager
log-probs and gradients (float rounding aside), with gradient checkpointing and on packed
streams too, and one compiled graph serves every layer (no recompilation per layer)."""

from __future__ import annotations

import torch

from asyncrl.core.config.job import Config, ModelConfig
from asyncrl.learner.compute.model import (
    build_policy,
    compile_layers,
    decoder_layers,
    token_logprobs,
)


def _logprobs_and_grads(model_dir: str, *, compile: bool, ckpt: bool, packed: bool):
    torch.manual_seed(0)
    cfg = Config(model=ModelConfig(gradient_checkpointing=ckpt, compile=compile))
    model = build_policy(model_dir, cfg, packed=packed)
    ids = torch.randint(0, 32, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # a shorter row: padding, or a shorter document when packed
    mask[2, 5:] = 0
    out = []
    for width in (12, 10):  # a second sequence length: the dynamic-shape recompile
        logp, _ = token_logprobs(model, ids[:, :width], mask[:, :width])
        model.zero_grad()
        (logp * mask[:, 1:width]).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        out.append((logp.detach() * mask[:, 1:width], grads))
    return out


def test_compiled_layers_give_the_eager_logprobs_and_gradients(tiny_model):
    """With gradient checkpointing (the recompute runs the compiled forward too) and packed
    rows (the document mask as a graph input); one case: a compilation costs ~20 s here."""
    torch._dynamo.reset()
    eager = _logprobs_and_grads(tiny_model, compile=False, ckpt=True, packed=True)
    compiled = _logprobs_and_grads(tiny_model, compile=True, ckpt=True, packed=True)
    for (lp_e, g_e), (lp_c, g_c) in zip(eager, compiled, strict=True):
        torch.testing.assert_close(lp_c, lp_e, rtol=1e-4, atol=1e-5)
        assert g_c.keys() == g_e.keys()
        for name in g_e:
            torch.testing.assert_close(g_c[name], g_e[name], rtol=1e-3, atol=1e-5, msg=name)


def test_one_compilation_serves_every_layer(tiny_model):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = build_policy(tiny_model)
    assert compile_layers(model) == len(decoder_layers(model)) == 2
    ids = torch.randint(0, 32, (2, 8))
    token_logprobs(model, ids, torch.ones_like(ids))[0].sum().backward()
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
