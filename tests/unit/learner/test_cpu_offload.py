"""``learner.cpu_offload``: FSDP2's ``CPUOffloadPolicy`` on every FSDP unit of the policy, the
reference and the critic, shards materialised on the host; refused where there is no GPU.

FSDP2 offloads from an accelerator only (on this CPU machine ``fully_shard`` with the policy
raises "Cannot access accelerator device"), so the sharding calls are checked with a
recording ``fully_shard`` (logic only); the offloaded step itself is not run here: it is
not verified on a GPU yet (docs/gpu.md).
"""

from __future__ import annotations

import pytest
import torch

from asyncrl.core.config.load import ConfigError, load_config
from asyncrl.learner.compute import model as model_mod
from tests.unit.learner.test_logprobs import tiny_qwen


@pytest.fixture
def recorded(monkeypatch):
    import torch.distributed.fsdp as fsdp

    calls = []
    monkeypatch.setattr(fsdp, "fully_shard", lambda module, **kw: calls.append((module, kw)))
    return calls


@pytest.mark.parametrize("offload", [False, True])
def test_every_fsdp_unit_gets_the_offload_policy(recorded, offload):
    from torch.distributed.fsdp import CPUOffloadPolicy

    model = tiny_qwen(tie=True)
    model_mod.shard_model(model, "bfloat16", offload=offload)
    units = [m for m, _ in recorded]
    assert units == [*model.model.layers, model]  # each decoder layer, then the root
    for _, kw in recorded:
        assert isinstance(kw.get("offload_policy"), CPUOffloadPolicy) == offload
        assert kw["mp_policy"].param_dtype == torch.bfloat16


def test_offloaded_shards_are_materialised_on_the_host(recorded, monkeypatch, tiny_model):
    from asyncrl.learner.compute import sharded_load

    homes = []
    monkeypatch.setattr(sharded_load, "build_sharded",
                        lambda construct, shard, home: homes.append(home) or 1 / 0)  # fmt: skip
    for offload, want in [(True, "cpu"), (False, "cuda")]:
        with pytest.raises(ZeroDivisionError):
            model_mod.load_sharded_hf_model(tiny_model, "float32", None, torch.device("cuda"),
                                            offload=offload)  # fmt: skip
        assert homes.pop().type == want


def test_cpu_offload_on_a_cpu_learner_is_refused():
    with pytest.raises(ConfigError, match="learner.cpu_offload=true moves FSDP2's shards off"):
        load_config(["learner.device=cpu", "learner.cpu_offload=true"])
    assert load_config(["learner.device=cuda", "learner.cpu_offload=true"]).learner.cpu_offload


def test_cpu_offload_with_device_auto_on_a_machine_without_gpu_is_a_clear_error(tiny_model):
    from asyncrl.core.runtime.fatal import FatalError
    from asyncrl.learner.trainer import build_step_context

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: device=auto resolves to it")
    cfg = load_config(["learner.device=auto", "learner.cpu_offload=true"])
    with pytest.raises(FatalError, match="learner.cpu_offload=true needs a GPU learner"):
        build_step_context(cfg, tiny_model, 0, 1)
