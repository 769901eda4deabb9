"""Adapter-only sync's bookkeeping in an actor (asyncrl/actors/engine/adapters.py): one LoRA
adapter per version, a request holds the one it started with, and only older adapters that
nothing holds are dropped (never a newer one being written by a sync under way)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("vllm", reason="LoRARequest is vLLM's")

from asyncrl.actors.engine.adapters import Adapters  # noqa: E402


def _write(adapters: Adapters, version: int) -> None:
    d = adapters.dir_for(version)
    d.mkdir(parents=True)
    (d / "adapter_model.safetensors").write_bytes(b"x")


def test_requests_hold_their_version_and_only_older_unheld_adapters_go(tmp_path):
    adapters = Adapters(rank=8, alpha=16.0, root=tmp_path)
    with adapters.hold() as (lora, version):
        assert lora is None and version is None  # before any sync: the base model
    _write(adapters, 1)
    adapters.publish(1)
    assert (adapters.current.lora_name, adapters.current.lora_int_id) == ("v1", 2)
    with adapters.hold() as (lora, version):
        assert version == 1
        _write(adapters, 2)
        assert adapters.unused() == []  # 2 is being written, 1 is current
        adapters.publish(2)
        assert adapters.unused() == []  # 1 is held by this request
    assert adapters.unused() == [1]
    adapters.forget(1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v2"]
    _write(adapters, 3)  # a sync under way: newer than current, never dropped
    assert adapters.unused() == []


def test_an_adapter_that_was_not_written_is_not_published(tmp_path):
    adapters = Adapters(rank=8, alpha=16.0, root=tmp_path)
    with pytest.raises(FileNotFoundError, match="adapter of version 4 missing"):
        adapters.publish(4)
    assert adapters.current is None


def test_the_worker_writes_a_peft_adapter_whole_and_names_its_modules(tmp_path):
    from safetensors.torch import load_file

    from asyncrl.actors.weights.receiver import write_adapter_dir

    adapters = Adapters(rank=2, alpha=4.0, root=tmp_path)
    info = adapters.update_info(5)
    tensors = {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(2, 3),
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(3, 2),
        "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight": torch.ones(2, 3),
        "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight": torch.zeros(3, 2),
    }
    out = tmp_path / "v5"
    assert info["adapter_dir"] == str(out)
    write_adapter_dir(out, tensors, info["adapter_config"])
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (2, 4.0)
    assert config["target_modules"] == ["down_proj", "q_proj"] and config["peft_type"] == "LORA"
    assert set(load_file(str(out / "adapter_model.safetensors"))) == set(tensors)
    assert not list(tmp_path.glob(".tmp-*"))  # written aside, then renamed
    write_adapter_dir(out, tensors, info["adapter_config"])  # a retried sync replaces it
    adapters.publish(5)
    assert adapters.version == 5
