"""actors/engine/vllm_engine.py ``_new_llm``: an eager engine on a CPU turns ``torch.compile`` off for
itself and its processes (the sampler helpers vLLM compiles cost ~1.9 s of every engine's
first batch there); a compiled engine and a GPU engine keep it. Fakes stand in for vLLM."""

from __future__ import annotations

import gc
import os
from types import SimpleNamespace

import pytest
import torch._dynamo

from asyncrl.actors.engine.vllm_engine import _new_llm


class FakeLLM:
    @classmethod
    def from_vllm_config(cls, config, **kw):
        return config


def _args(eager: bool):
    config = SimpleNamespace(model_config=SimpleNamespace(enforce_eager=eager))
    return SimpleNamespace(create_engine_config=lambda: config, enable_log_requests=False,
                           disable_log_stats=True)  # fmt: skip


@pytest.fixture
def clean(monkeypatch):
    monkeypatch.delenv("TORCH_COMPILE_DISABLE", raising=False)
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    with torch._dynamo.config.patch(disable=False):  # restored after the test
        yield
    gc.unfreeze()  # a fork start froze the heap (asyncrl/core/runtime/heap.py)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_an_eager_cpu_engine_starts_with_compile_off_here_and_in_spawned_processes(clean, method):
    _new_llm(FakeLLM, _args(eager=True), cpu=True, cpu_start_method=method)
    assert torch._dynamo.config.disable is True  # this process, and forked ones
    assert os.environ["TORCH_COMPILE_DISABLE"] == "1"  # spawned ones
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == method
    # what a fork inherits is frozen first (its collections skip it)
    assert (gc.get_freeze_count() > 0) == (method == "fork")


@pytest.mark.parametrize(("eager", "cpu"), [(False, True), (True, False), (False, False)])
def test_a_compiled_or_gpu_engine_keeps_compile(clean, eager, cpu):
    _new_llm(FakeLLM, _args(eager=eager), cpu=cpu, cpu_start_method="fork")
    assert torch._dynamo.config.disable is False
    assert "TORCH_COMPILE_DISABLE" not in os.environ
