"""``model.compile`` on a GPU: the compiled decoder layers (``asyncrl.learner.compute.model.compile_layers``)
give the eager log-probs, entropy and gradients on packed rows with flex_attention (compiled
inside the compiled layer there) and sdpa, in bfloat16, with gradient checkpointing, and over
two stream lengths (the dynamic-shape recompile). Skipped without a CUDA GPU; the CPU
version (float32, sdpa) is tests/unit/learner/test_compile_layers.py."""

from __future__ import annotations

import pytest
import torch

from asyncrl.learner.compute.model import compile_layers, enable_gradient_checkpointing
from asyncrl.learner.compute.packing import set_packed

from .test_packing_gpu import LENGTHS, _run, model_and_rows

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA GPU (torch.cuda.is_available() is False); runs on a GPU machine",
    ),
]


def _both_lengths(model, ids, mask, weights):
    """``_run`` on all rows, then on all but the last (a shorter packed stream)."""
    return [_run(model, ids, mask, weights), _run(model, ids[:-1], mask[:-1], weights[:-1])]


@pytest.mark.parametrize("attn", ["flex_attention", "sdpa"])
def test_compiled_layers_on_a_gpu_give_the_eager_values(attn):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model, ids, mask = model_and_rows(attn)
    enable_gradient_checkpointing(model)
    set_packed(model, True)
    weights = torch.randn(len(LENGTHS), ids.shape[1] - 1, device="cuda")
    eager = _both_lengths(model, ids, mask, weights)
    assert compile_layers(model) == 2
    compiled = _both_lengths(model, ids, mask, weights)
    assert counters["stats"]["unique_graphs"] >= 1, "nothing was compiled"
    for (lp_e, ent_e, g_e), (lp_c, ent_c, g_c) in zip(eager, compiled, strict=True):
        scored = mask[: lp_e.shape[0], 1:].bool()
        assert float((lp_c - lp_e)[scored].abs().max()) < 0.05, attn
        assert float((ent_c - ent_e)[scored].abs().max()) < 0.05, attn
        for name, g in g_e.items():
            rel = float((g_c[name] - g).norm() / g.norm().clamp_min(1e-12))
            assert rel < 0.05, (attn, name, rel)
