"""Adapter-only checkpoints (``model.lora``; learner/state/checkpoint.py, run_state.py): dcp/
holds the adapters and their optimizer state, not the frozen base; ``hf/`` only on request;
a resume restores adapters and optimizer on top of ``model.path`` and refuses another base
(learner/lora/base.py)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from asyncrl.core.config.job import Config
from asyncrl.core.config.learner import LoraConfig, ModelConfig
from asyncrl.core.runtime.fatal import FatalError
from asyncrl.learner.compute.model import build_policy
from asyncrl.learner.compute.step import StepContext
from asyncrl.learner.lora.base import base_fingerprint, base_mismatch
from asyncrl.learner.state.run_state import LearnerState, SaveOptions, maybe_resume
from asyncrl.learner.state.run_state import save_run_checkpoint as save


@pytest.fixture(autouse=True)
def one_rank(tmp_path_factory):
    """A one-rank gloo process group, as a learner of one rank has."""
    import torch.distributed as dist

    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class _Hub:
    """The checkpoint hub's calls (the buffer's acks), recorded."""

    def __init__(self):
        self.said: list[str] = []

    def say(self, text):
        self.said.append(text)

    def trained_ids(self):
        return []

    def ack_trained(self):
        pass

    def ack_ids(self, ids):
        pass

    def tallies(self):
        return {}

    def restore_tallies(self, saved):
        pass


def _ctx(model_dir, seed: int) -> StepContext:
    torch.manual_seed(seed)
    cfg = Config(model=ModelConfig(lora=LoraConfig(rank=4, alpha=8.0)))
    model = build_policy(model_dir, cfg)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    return StepContext(model, opt, cfg.algorithm, 0, 1, 1.0)


def _train(ctx: StepContext) -> None:
    x = torch.randint(1, 32, (2, 7), generator=torch.Generator().manual_seed(1))
    ctx.model(x).logits.square().mean().backward()
    ctx.optimizer.step()
    ctx.optimizer.zero_grad()


def _trained(ctx):
    return {n: p.detach().clone() for n, p in ctx.model.named_parameters() if p.requires_grad}


@pytest.fixture
def saved(tiny_model, tmp_path):
    ctx = _ctx(tiny_model, 0)
    _train(ctx)
    save(tmp_path, ctx, LearnerState(version=1), tiny_model, _Hub(), SaveOptions(hf_export=False))
    return tmp_path / "checkpoints" / "step_000001", ctx


def test_the_checkpoint_holds_the_adapters_and_names_its_base_not_the_base(saved, tiny_model):
    from torch.distributed.checkpoint import FileSystemReader

    path, ctx = saved
    assert sorted(p.name for p in path.iterdir()) == [
        "COMPLETE", "adapter", "dcp", "manifest.json", "state.json"
    ]  # fmt: skip
    keys = FileSystemReader(str(path / "dcp")).read_metadata().state_dict_metadata
    model_keys = {k.removeprefix("model.") for k in keys if k.startswith("model.")}
    assert model_keys == set(_trained(ctx)), "only the adapters are stored (no tied head)"
    assert any(k.startswith("optim.state.") for k in keys)
    state = json.loads((path / "state.json").read_text())
    assert state["lora_base"] == base_fingerprint(tiny_model)
    assert state["lora_base"]["files"], "the base's weight files are named"


def test_a_resume_restores_adapters_and_optimizer_on_the_base(saved, tiny_model):
    path, ctx = saved
    fresh = _ctx(tiny_model, 1)  # other random lora_A: the load must replace them
    assert any(not torch.equal(a, _trained(fresh)[n]) for n, a in _trained(ctx).items())
    hub = _Hub()
    state = maybe_resume(str(path.parent.parent), fresh, hub, model_dir=tiny_model)
    assert state.version == 1 and hub.said == [f"resumed from {path} at version 1"]
    for n, a in _trained(ctx).items():
        torch.testing.assert_close(_trained(fresh)[n], a, rtol=0, atol=0)
    _train(ctx), _train(fresh)  # the restored AdamW moments give the same next update
    for n, a in _trained(ctx).items():
        torch.testing.assert_close(_trained(fresh)[n], a)


def test_a_resume_on_another_base_is_refused_naming_both(saved, tiny_model, tmp_path):
    path, _ = saved
    other = tmp_path / "other_base"
    shutil.copytree(tiny_model, other)
    weights = next(p for p in other.iterdir() if p.suffix == ".safetensors")
    data = bytearray(weights.read_bytes())
    data[-8:] = bytes(8)  # another model of the same shapes: different bytes
    weights.write_bytes(bytes(data))
    fresh = _ctx(str(other), 1)
    with pytest.raises(FatalError, match="holds LoRA adapters only.*model.path") as e:
        maybe_resume(str(path.parent.parent), fresh, _Hub(), model_dir=str(other))
    assert str(other) in str(e.value) and weights.name in str(e.value)


def test_the_merged_export_is_written_on_request(tiny_model, tmp_path):
    ctx = _ctx(tiny_model, 0)
    save(tmp_path, ctx, LearnerState(version=2), tiny_model, _Hub(), SaveOptions())
    path = tmp_path / "checkpoints" / "step_000002"
    assert (path / "hf" / "config.json").is_file() and (path / "adapter").is_dir()


def test_base_mismatch_names_missing_files_and_accepts_no_fingerprint(tiny_model, tmp_path):
    assert base_mismatch(None, tiny_model) is None  # a checkpoint that holds its base
    assert base_mismatch(base_fingerprint(tiny_model), tiny_model) is None
    (tmp_path / "config.json").write_text("{}")
    problem = base_mismatch(base_fingerprint(tiny_model), tmp_path)
    assert problem is not None and "has none" in problem


def test_a_tied_head_is_not_stored_and_loads_back_tied(tiny_model, tmp_path):
    """A tied LM head is a state-dict alias of the frozen embedding, which DCP's frozen
    filter does not see (the demo model and SmolLM2 tie theirs: 113 MB for SmolLM2)."""
    from torch.distributed.checkpoint import FileSystemReader
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(tiny_model)
    config.tie_word_embeddings = True
    torch.manual_seed(2)
    tied = tmp_path / "tied"
    AutoModelForCausalLM.from_config(config).save_pretrained(tied)
    ctx = _ctx(str(tied), 0)
    assert ctx.model.lm_head.weight is ctx.model.model.embed_tokens.weight
    _train(ctx)
    save(tmp_path, ctx, LearnerState(version=1), str(tied), _Hub(), SaveOptions(hf_export=False))
    path = tmp_path / "checkpoints" / "step_000001"
    keys = FileSystemReader(str(path / "dcp")).read_metadata().state_dict_metadata
    assert {k.removeprefix("model.") for k in keys if k.startswith("model.")} == set(_trained(ctx))
    fresh = _ctx(str(tied), 1)
    maybe_resume(str(tmp_path), fresh, _Hub(), model_dir=str(tied))
    assert fresh.model.lm_head.weight is fresh.model.model.embed_tokens.weight
    for n, a in _trained(ctx).items():
        torch.testing.assert_close(_trained(fresh)[n], a, rtol=0, atol=0)
