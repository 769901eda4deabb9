"""Where completions end: the union of the generation config's EOS ids,
the tokenizer's EOS and the chat template's end-of-turn token (``asyncrl.actors.engine.stop_tokens``), passed
as ``stop_token_ids`` of every request (``asyncrl.actors.engine.args.sampling_kwargs``,
``ActorEngine.generate``), on real tokenizers and model directories written here and on a
fake ``AsyncLLM``."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from asyncrl.actors.engine.args import sampling_kwargs
from asyncrl.actors.engine.stop_tokens import (
    chat_end_of_turn,
    generation_eos_ids,
    model_stop_token_ids,
    union_stop_ids,
)
from asyncrl.actors.engine.vllm_engine import ActorEngine
from asyncrl.orchestration.demo.tokenizer import CHAT_TEMPLATE, build_tokenizer

transformers = pytest.importorskip("transformers")

IM_END = "<|im_end|>"
CHATML_LIKE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}" + IM_END + "\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
"""The demo template with ChatML's end-of-turn token (its roles are plain text: the demo
alphabet cannot spell ``<|im_start|>``)."""


def _chat_tokenizer(template: str = CHATML_LIKE):
    """The demo tokenizer (EOS ``<|endoftext|>`` = 1) plus a special ``<|im_end|>`` (id 64)."""
    tok = build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IM_END]})
    tok.chat_template = template
    return tok


def _model_dir(path, tokenizer, *, config_eos=1, generation_eos="same"):
    """A model directory without weights: config.json, generation_config.json (unless
    ``generation_eos`` is None), tokenizer files."""
    config = transformers.Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=64, eos_token_id=config_eos, bos_token_id=1,
    )  # fmt: skip
    config.save_pretrained(str(path))
    if generation_eos is not None:
        eos = config_eos if generation_eos == "same" else generation_eos
        transformers.GenerationConfig(eos_token_id=eos).save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


def test_union_drops_nones_and_repeats():
    assert union_stop_ids([7, 2], 2, None, 64) == [2, 7, 64]
    assert union_stop_ids(None, None) == []


def test_chat_end_of_turn_is_the_special_token_after_the_assistant_content():
    tok = _chat_tokenizer()
    assert tok.convert_tokens_to_ids(IM_END) == 64
    assert chat_end_of_turn(tok) == 64


def test_no_end_of_turn_token_when_the_template_ends_turns_with_text():
    tok = build_tokenizer()
    assert tok.chat_template == CHAT_TEMPLATE  # the demo's: "\n" after each message
    assert chat_end_of_turn(tok) is None
    tok.chat_template = None
    assert chat_end_of_turn(tok) is None


def test_a_template_that_refuses_the_probe_gives_none():
    tok = _chat_tokenizer("{{ raise_exception('system message required') }}")
    assert chat_end_of_turn(tok) is None


def test_the_demo_model_stops_at_its_eos_only(tmp_path):
    """The demo directory's generation config, tokenizer EOS and template agree: [1]."""
    from asyncrl.orchestration.demo.tokenizer import save_tokenizer

    tok = save_tokenizer(tmp_path)
    _model_dir(tmp_path, tok)
    assert model_stop_token_ids(tmp_path) == [1]


def test_the_union_of_generation_config_tokenizer_and_chat_template(tmp_path):
    """generation_config eos [1, 5] (a list, as Llama 3 and Qwen2.5 ship), tokenizer EOS 1,
    end-of-turn 64: vLLM alone stops at 1 and 5 only."""
    _model_dir(tmp_path, _chat_tokenizer(), generation_eos=[1, 5])
    assert generation_eos_ids(tmp_path) == [1, 5]
    assert model_stop_token_ids(tmp_path) == [1, 5, 64]


def test_without_generation_config_the_config_eos_counts_as_vllm_reads_it(tmp_path):
    _model_dir(tmp_path, _chat_tokenizer(), config_eos=3, generation_eos=None)
    assert not (tmp_path / "generation_config.json").exists()
    assert model_stop_token_ids(tmp_path) == [1, 3, 64]


def test_without_tokenizer_files_the_generation_config_ids_remain(tmp_path):
    _model_dir(tmp_path, _chat_tokenizer(), generation_eos=[1, 5])
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (tmp_path / name).unlink(missing_ok=True)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen2"
    assert model_stop_token_ids(tmp_path) == [1, 5]


# -- the sampling parameters ---------------------------------------------------------------


def test_sampling_kwargs_carry_the_stop_ids_except_with_ignore_eos():
    kw = sampling_kwargs(2, 8, 1.0, 0, stop_token_ids=[64, 1, 64])
    assert kw["stop_token_ids"] == [1, 64]
    kw = sampling_kwargs(2, 8, 1.0, 0, stop_token_ids=[1], ignore_eos=True)
    assert kw["stop_token_ids"] == []  # vLLM would stop at them even when it ignores EOS


def test_vllm_adds_its_generation_config_ids_to_ours():
    """vLLM's engine calls ``update_from_generation_config`` on each request: ours stay, its
    tokenizer EOS becomes the primary EOS, the generation config's other ids join."""
    sampling = pytest.importorskip("vllm.sampling_params", reason="needs vllm")
    params = sampling.SamplingParams(**sampling_kwargs(2, 8, 1.0, 0, stop_token_ids=[1, 64]))
    params.update_from_generation_config({"eos_token_id": [1, 5]}, eos_token_id=1)
    assert params.eos_token_id == 1
    assert sorted(params.stop_token_ids) == [1, 5, 64]
    assert params.all_stop_token_ids == {1, 5, 64}


class _FakeLLM:
    """``AsyncLLM.generate`` that records the params and returns one finished completion."""

    def __init__(self):
        self.params = []

    async def generate(self, prompt, params, request_id):
        self.params.append(params)
        span = SimpleNamespace(version="0", start=0, end=2)
        out = SimpleNamespace(index=0, token_ids=[5, 64], finish_reason="stop",
                              logprobs=[{5: SimpleNamespace(logprob=-0.5)},
                                        {64: SimpleNamespace(logprob=-0.1)}],
                              weight_versions=[span])  # fmt: skip
        yield SimpleNamespace(outputs=[out])


def test_every_request_of_the_engine_carries_its_stop_ids():
    pytest.importorskip("vllm", reason="ActorEngine.generate builds vLLM's SamplingParams")
    llm = _FakeLLM()
    engine = ActorEngine(llm, version=0, stop_token_ids=[1, 64])
    (c,) = asyncio.run(engine.generate([3, 4], 1, 8, 1.0, 0))
    assert (c.token_ids, c.finish_reason) == ([5, 64], "stop")
    asyncio.run(engine.generate([3, 4], 1, 8, 1.0, 0, ignore_eos=True))
    assert [p.stop_token_ids for p in llm.params] == [[1, 64], []]
