"""``model.lora`` end to end: synchronous runs of the demo model with rank-8 adapters (real
redis-server, a real vLLM actor, the learner). The main run is multi-turn (``experiment=chain``,
two turns an episode), the actor receiving the adapters alone at every version
(``model.lora.sync=adapter``, the default), its checkpoints adapter-only; then a resume of the
same run syncing the merged model (``merged``) and exporting it, and ``asyncrl eval`` of an
adapter-only checkpoint.

At ``mode=sync`` every group is sampled by the weights the learner trains from, so the
behaviour log-probs (vLLM's) and the learner's must agree at every step, every turn included:
they would not if the actor ran other weights than the learner's adapted model (the export
shows how far the adapters moved the model from the base).
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest
import torch

from tests.e2e.conftest import needs_full_stack, read_metrics, read_summary, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.redis]

LORA = ["mode=sync", "model.lora.rank=8", "learner.lr=5e-3"]
ARGS = ["experiment=chain", "model.sft_steps=50", *LORA, "learner.checkpoint_every=3",
        "learner.batch_groups=4", "eval.at_start=false", "eval.at_end=false", "eval.every=0"]  # fmt: skip


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    needs_full_stack()
    run_dir = tmp_path_factory.mktemp("lora")
    first = run_cli(["run", *ARGS, "learner.steps=6", f"run_dir={run_dir}"], timeout=600)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    return run_dir, first.stdout + first.stderr


def test_the_actor_samples_with_the_learners_adapted_weights_at_every_step(lora_run):
    run_dir, out = lora_run
    assert "LoRA rank 8, alpha 16 on " in out and "parameters train" in out, out[-3000:]
    records = read_metrics(run_dir)
    assert [r["version"] for r in records] == list(range(1, 7))
    assert any(r["grad_norm"] > 0 for r in records), "nothing trained: the check would be void"
    assert any(r["episode/turns_mean"] > 1 for r in records), "no second turn was trained"
    for r in records:
        assert abs(r["approx_kl_behave"]) < 1e-6 and r["is_weight_max"] < 1.001, r
    s = read_summary(run_dir)
    sync = s["weight_sync"]
    assert sync["count"] >= 6 and sync["failures"] == 0, s
    model_bytes = sum(p.stat().st_size for p in _base_dir(out).glob("*.safetensors"))
    assert sync["bytes"] / sync["count"] < 0.2 * model_bytes, (sync, model_bytes)  # adapters only


def _base_dir(out: str) -> Path:
    """The base model the run's actor served (its console names it)."""
    return Path(out.split("starting the vLLM engine (", 1)[1].split(")", 1)[0])


def test_the_checkpoint_is_adapter_only_and_names_its_base(lora_run):
    run_dir, out = lora_run
    step = run_dir / "checkpoints" / "step_000006"
    assert not (step / "hf").exists(), "the merged export is written on request only"
    adapter = step / "adapter"  # PEFT's format
    assert sorted(p.name for p in adapter.iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors"
    ]  # fmt: skip
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(str(step / "dcp")).read_metadata().state_dict_metadata
    weights = [k for k in keys if k.startswith("model.")]
    assert weights and all(".lora_A." in k or ".lora_B." in k for k in weights), weights[:5]
    manifest = (step / "manifest.json").read_text()
    assert "adapter/adapter_model.safetensors" in manifest
    base = json.loads((step / "state.json").read_text())["lora_base"]
    assert Path(base["path"]) == _base_dir(out).resolve() and base["files"]


def _check_merged_export(step: Path, out: str) -> None:
    """``model.lora.export_merged``: ``hf/`` is a plain model (no adapter names) the adapters
    moved away from the base, beside ``adapter/``."""
    from safetensors.torch import load_file

    export = load_file(glob.glob(str(step / "hf" / "*.safetensors"))[0])
    assert not [k for k in export if ".lora_" in k or ".base_layer." in k]
    base = load_file(glob.glob(f"{_base_dir(out)}/*.safetensors")[0])
    assert set(export) <= set(base)
    moved = max(float((export[k] - base[k]).abs().max()) for k in export)
    assert moved > 1e-3, moved
    untouched = [k for k in export if "embed" in k or "norm" in k]
    assert untouched and all(torch.equal(export[k], base[k]) for k in untouched)
    assert (step / "adapter" / "adapter_model.safetensors").is_file()


def test_a_resumed_run_restores_the_adapters_and_trains_on_with_merged_syncs(lora_run):
    """The resume syncs the merged model (``model.lora.sync=merged``: the whole model with
    the adapters merged in, for engines without LoRA; what it sends is in
    tests/unit/learner/test_lora.py) and exports it as ``hf/`` (``export_merged``)."""
    run_dir, _ = lora_run
    merged = ["model.lora.sync=merged", "model.lora.export_merged=true"]
    again = run_cli(["run", *ARGS, *merged, "learner.steps=8", f"run_dir={run_dir}"], timeout=600)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-4000:]
    assert f"resumed from {run_dir / 'checkpoints' / 'step_000006'} at version 6" in out, out
    records = read_metrics(run_dir)
    assert [r["version"] for r in records][-2:] == [7, 8]
    for r in records[-2:]:  # the resumed adapters, merged, are what the actor samples with
        assert abs(r["approx_kl_behave"]) < 1e-6 and r["is_weight_max"] < 1.001, r
    _check_merged_export(run_dir / "checkpoints" / "step_000008", out)


def test_eval_serves_a_lora_checkpoint_as_its_adapter_on_the_base(lora_run, tmp_path):
    """``asyncrl eval --checkpoint`` of an adapter-only checkpoint: vLLM loads the base
    (``model.path`` resolved from the run's settings) with ``adapter/`` as every request's
    LoRARequest; another base is refused before an engine starts."""
    run_dir, out = lora_run
    step = run_dir / "checkpoints" / "step_000006"  # the resume test may add step_000008
    quick = ["eval.max_prompts=4", "eval.n_samples=2"]
    proc = run_cli(["eval", "--checkpoint", str(step), f"run_dir={tmp_path / 'eval'}",
                    "experiment=chain", "model.sft_steps=50", *quick], timeout=300)  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-4000:]
    assert f"LoRA adapter {step / 'adapter'} (rank 8) on the base model" in said, said[-3000:]
    doc = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert (doc["checkpoint"], doc["version"], doc["adapter"]) == (
        str(step), 6, str(step / "adapter")
    )  # fmt: skip
    assert doc["model"] == str(_base_dir(out).resolve()) and doc["complete"] is True
    other = run_cli(["eval", "--checkpoint", str(step), f"run_dir={tmp_path / 'other'}",
                     "experiment=tiny", "model.sft_steps=500", *quick], timeout=300)  # fmt: skip
    said = other.stdout + other.stderr
    assert other.returncode == 1, said[-4000:]
    assert "belong to another base model" in other.stderr and str(step) in other.stderr, said
    assert "starting the vLLM engine" not in said, said[-3000:]
    assert not (tmp_path / "other" / "eval.json").exists()
