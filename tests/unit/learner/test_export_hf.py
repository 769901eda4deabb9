"""The HF export of a checkpoint: in the training dtype, shard by shard (only rank
0 keeps a tensor, and only until its shard is written), named as ``save_pretrained`` names
shards, and loaded back by transformers with the same values."""

from __future__ import annotations

import json

import torch
from safetensors import safe_open

from asyncrl.learner.state.checkpoint import export_hf


def _model(tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=True)  # fmt: skip
    model = Qwen2ForCausalLM(cfg)
    source = tmp_path / "source"
    model.save_pretrained(source)
    return model, source


def test_a_bfloat16_export_in_shards_loads_back_with_the_same_values(tmp_path):
    from transformers import AutoModelForCausalLM

    model, source = _model(tmp_path)
    out = tmp_path / "hf"
    export_hf(model, out, source, torch.bfloat16, shard_bytes=8 << 10)
    shards = sorted(out.glob("model-*-of-*.safetensors"))
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(shards) > 2 and set(index["weight_map"].values()) == {p.name for p in shards}
    assert not (out / "model.safetensors").exists() and not list(out.glob(".shard-*"))
    for p in shards:
        with safe_open(str(p), framework="pt") as f:
            assert all(f.get_tensor(k).dtype == torch.bfloat16 for k in f.keys())  # noqa: SIM118
    assert "lm_head.weight" not in index["weight_map"]  # tied: written once
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    back = AutoModelForCausalLM.from_pretrained(out)
    assert back.lm_head.weight is back.model.embed_tokens.weight
    want = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    got = back.state_dict()
    assert all(torch.equal(got[k].to(torch.bfloat16), w) for k, w in want.items())


def test_one_shard_is_model_safetensors_and_float32_stays_float32(tmp_path):
    model, source = _model(tmp_path)
    out = tmp_path / "hf"
    export_hf(model, out, source)
    assert [p.name for p in out.glob("*.safetensors")] == ["model.safetensors"]
    assert not (out / "model.safetensors.index.json").exists()
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.float32
