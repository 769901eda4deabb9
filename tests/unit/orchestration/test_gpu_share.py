"""One GPU for the learner and a vLLM actor: the memory split is checked with
numbers before anything starts (asyncrl/orchestration/placement/share.py), the launcher reads the GPU's memory
and the model's size for it (asyncrl/orchestration/placement/gpus.py, model_dir.py), and the learner
caps its own allocations (learner/compute/device.py). No GPU here: nvidia-smi's text and torch.cuda
are faked; what runs on a real GPU is stated in docs/gpu.md."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from asyncrl.core.config.load import load_config
from asyncrl.learner.compute.device import limit_memory
from asyncrl.orchestration.models.directory import count_params
from asyncrl.orchestration.placement.gpus import check_shared_gpu, gpu_memory_gib
from asyncrl.orchestration.placement.plan import place, request_for
from asyncrl.orchestration.placement.share import Share, check

B15 = 1_540_000_000  # Qwen2.5-1.5B


def _share(**kw) -> Share:
    base = dict(total_gib=80.0, learner_fraction=0.45, actor_fraction=0.45, actors=1,
                params=B15, dtype="bfloat16")  # fmt: skip
    return Share(**{**base, **kw})


def test_a_1_5b_model_fits_an_80_gib_gpu_split_in_halves():
    line = check(_share())
    assert line.startswith("one GPU of 80.0 GiB shared by the learner and 1 vLLM actor(s)")
    assert "learner 36.0 GiB (needs 25.8 before activations)" in line
    assert "vLLM 36.0 GiB each (2.9 of weights" in line


def test_fractions_that_overfill_the_gpu_are_refused_with_a_fix():
    with pytest.raises(ValueError) as e:
        check(_share(learner_fraction=0.5, actor_fraction=0.5))
    msg = str(e.value)
    assert "learner.gpu_memory_fraction=0.5 + 1 x actor.gpu_memory_utilization=0.5" in msg
    assert "1.2 GiB of CUDA contexts is 1.01 of the GPU" in msg
    assert "e.g. learner.gpu_memory_fraction=0.48" in msg


def test_a_learner_share_too_small_for_the_model_is_refused_with_the_numbers():
    with pytest.raises(ValueError) as e:
        check(_share(total_gib=24.0, params=7_600_000_000))
    msg = str(e.value)
    assert "the learner needs at least 127.4 GiB" in msg and "gives it 10.8 GiB" in msg
    assert "learner.cpu_offload=true" in msg and "layout=node2" in msg


def test_a_vllm_share_without_room_for_a_kv_cache_is_refused():
    with pytest.raises(ValueError, match=r"vLLM needs 2\.9 GiB for the weights .* gives it 2\.4"):
        check(_share(learner_fraction=0.85, actor_fraction=0.03, dtype="bfloat16"))


def test_an_unknown_model_size_checks_the_fractions_only():
    assert "only the fractions were checked" in check(_share(params=0))


def _safetensors(path, shapes: dict[str, list[int]]) -> None:
    header = {n: {"dtype": "F32", "shape": s, "data_offsets": [0, 0]} for n, s in shapes.items()}
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def test_the_parameter_count_comes_from_the_safetensors_headers(tmp_path):
    _safetensors(tmp_path / "model-00001-of-00002.safetensors", {"a": [3, 4], "b": [5]})
    _safetensors(tmp_path / "model-00002-of-00002.safetensors", {"c": [2, 2, 2]})
    assert count_params(tmp_path) == 12 + 5 + 8
    assert count_params(tmp_path / "nothing") == 0


def test_the_real_small_model_is_counted_as_transformers_counts_it(tiny_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert count_params(__import__("pathlib").Path(tiny_model)) == sum(
        p.numel() for p in model.parameters()
    )


SMI = "0, GPU-aaaa, 81559\n1, GPU-bbbb, 40960\n"


def test_the_gpu_memory_is_read_by_index_or_uuid():
    assert gpu_memory_gib("0", lambda: SMI) == pytest.approx(79.65, abs=0.01)
    assert gpu_memory_gib("GPU-bbbb", lambda: SMI) == 40.0
    assert gpu_memory_gib("7", lambda: SMI) is None
    assert gpu_memory_gib("0", lambda: "") is None


def test_the_launcher_checks_a_shared_gpu_and_nothing_else(tiny_model):
    from pathlib import Path

    cfg = load_config(["layout=gpu1"])
    plan = place(request_for(cfg, ("learner", "actors"), ("0",)))
    line = check_shared_gpu(cfg, plan, Path(tiny_model), memory=lambda g: 80.0)
    assert line.startswith("GPU 0: one GPU of 80.0 GiB shared by the learner and 1 vLLM")
    with pytest.raises(ValueError, match="nvidia-smi does not report GPU 0's memory"):
        check_shared_gpu(cfg, plan, Path(tiny_model), memory=lambda g: None)
    node2 = load_config(["layout=node2"])
    apart = place(request_for(node2, ("learner", "actors"), ("0", "1")))
    assert check_shared_gpu(node2, apart, Path(tiny_model), memory=lambda g: None) is None


class _FakeCuda:
    def __init__(self):
        self.calls = []

    def set_per_process_memory_fraction(self, fraction, device):
        self.calls.append((fraction, device))


def test_the_learner_caps_its_gpu_allocations_only_below_one():
    cuda = _FakeCuda()
    gpu = torch.device("cuda", 0)
    assert limit_memory(gpu, 0.45, cuda) and cuda.calls == [(0.45, gpu)]
    assert not limit_memory(gpu, 1.0, cuda) and len(cuda.calls) == 1
    assert not limit_memory(torch.device("cpu"), 0.45, cuda) and len(cuda.calls) == 1


def test_a_shared_gpu_sends_weights_through_host_memory():
    """NCCL cannot join two ranks on one GPU: auto picks shm on the shared layout."""
    from asyncrl.core.weights import transports

    cfg = load_config(["layout=gpu1"])
    both_ends = not cfg.learner.share_gpu  # learner/weights/publisher.py open_weight_channel
    assert transports.resolve(cfg.learner.weight_transport, both_ends, True) == "shm"
    assert transports.resolve("auto", True, True) == "nccl"  # two GPUs: as before


def test_with_lora_the_learner_needs_the_frozen_weights_only():
    """``model.lora``: no gradients or AdamW state for the base (6 B a parameter in bf16)."""
    line = check(_share(lora=True))
    assert "with LoRA" in line and "learner 36.0 GiB (needs 8.6 before activations)" in line
    with pytest.raises(ValueError) as e:
        check(_share(params=7_600_000_000, lora=True))
    msg = str(e.value)
    assert "needs at least 42.5 GiB (frozen weights, LoRA adapters, 6 B a parameter" in msg


def test_the_one_gpu_lora_preset_shares_the_gpu_and_trains_adapters():
    from asyncrl.core.config.load import load_config

    cfg = load_config(["layout=gpu1_lora"])
    assert cfg.learner.share_gpu and cfg.learner.nproc == 1 and cfg.actor.num_actors == 1
    assert cfg.model.lora.rank == 16 and cfg.model.lora.sync == "adapter"
    assert cfg.learner.gpu_memory_fraction + cfg.actor.gpu_memory_utilization < 1
    line = check(_share(learner_fraction=0.5, actor_fraction=0.45, params=3_000_000_000,
                        lora=True))  # fmt: skip
    assert "needs 16.8 before activations" in line  # a 3B model: 40 GiB for the learner
