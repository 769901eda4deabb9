"""The FSDP2 learner (2 gloo ranks, the async path) computes the same loss and update as a
single-process full-batch step (the synchronous reference) on the same groups.

At ``max_staleness=0`` async and sync differ only in *which* groups reach the learner; given
the same groups, the step must agree to float tolerance. Comparing updated weights after one
SGD step with a large learning rate compares the gradients.
"""

import json
import random
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from asyncrl.core.config.job import AlgorithmConfig
from asyncrl.core.runtime.torchrun import free_port as _free_port

sys.path.insert(0, str(Path(__file__).parent))
from fsdp_step_script import load_groups, one_update  # noqa: E402

VOCAB = 32


def _groups_json(path: Path, n_groups=4, n=4, seed=0) -> Path:
    """Random groups; about a quarter of the samples cut at the length limit (their own
    random stream, so the other fields do not depend on it)."""
    rng, cut = random.Random(seed), random.Random(seed + 1)
    groups = []
    for g in range(n_groups):
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 5))]
        samples = []
        for _ in range(n):
            c = rng.randint(1, 6)
            samples.append(
                {
                    "prompt_ids": prompt,
                    "completion_ids": [rng.randrange(1, VOCAB) for _ in range(c)],
                    "behavior_logprobs": [-rng.uniform(0.5, 4.0) for _ in range(c)],
                    "token_versions": [0] * c,
                    "reward": float(rng.random() < 0.5),
                    "finish_reason": "length" if cut.random() < 0.25 else "stop",
                }
            )
        groups.append({"id": f"g{g}", "samples": samples})
    out = path / "groups.json"
    out.write_text(json.dumps(groups))
    return out


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
@pytest.mark.parametrize("minibatches", [1, 2])
def test_fsdp2_two_ranks_match_single_process(tiny_model, tmp_path, aggregation, minibatches):
    algo = AlgorithmConfig(aggregation=aggregation, minibatches=minibatches)
    _two_ranks_match_one(tiny_model, tmp_path, algo)


def test_fsdp2_two_ranks_mask_truncated_rows_as_one_process(tiny_model, tmp_path):
    """``algorithm.truncated=mask``: each rank masks its rows, the aggregation's denominators
    the whole minibatch's (learner/algo/truncation.py); the batch reaches rank 1 by broadcast."""
    algo = AlgorithmConfig(aggregation="seq_mean_token_mean", minibatches=2, truncated="mask")
    _two_ranks_match_one(tiny_model, tmp_path, algo)
    groups = json.loads((tmp_path / "groups.json").read_text())
    cut = [s["finish_reason"] == "length" for g in groups for s in g["samples"]]
    assert 0 < sum(cut) < len(cut)


def test_fsdp2_two_ranks_train_lora_adapters_as_one_process(tiny_model, tmp_path):
    """``model.lora``: frozen base weights and trainable adapters in the same FSDP2 units;
    the merged weights after one update match one process's (asyncrl/learner/lora/), also
    after the two ranks saved an adapter-only checkpoint and loaded it into fresh adapters."""
    lora = {"rank": 4, "alpha": 8.0, "targets": ["q_proj", "v_proj", "down_proj"]}
    _two_ranks_match_one(tiny_model, tmp_path, AlgorithmConfig(), lora)
    assert (tmp_path / "ckpt" / "checkpoints" / "step_000001" / "adapter").is_dir()
    assert not (tmp_path / "ckpt" / "checkpoints" / "step_000001" / "hf").exists()


def _two_ranks_match_one(tiny_model, tmp_path, algo: AlgorithmConfig, lora=None):
    (tmp_path / "algo.json").write_text(json.dumps(asdict(algo)))
    if lora:
        (tmp_path / "lora.json").write_text(json.dumps(lora))
    groups_json = _groups_json(tmp_path)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}",
        str(Path(__file__).parent / "fsdp_step_script.py"),
        tiny_model,
        str(groups_json),
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    torch.set_num_threads(1)
    ref_loss, ref_weights = one_update(tiny_model, load_groups(groups_json), algo, 0.5, lora)
    fsdp_loss = json.loads((tmp_path / "loss.json").read_text())["loss"]
    fsdp_weights = load_file(str(tmp_path / "weights.safetensors"))
    if algo.minibatches == 1:
        assert fsdp_loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-6)
    init = load_file(str(Path(tiny_model) / "model.safetensors"))
    assert set(ref_weights) == set(fsdp_weights) and set(ref_weights) <= set(init)  # HF names
    moved = 0.0
    for name, ref in ref_weights.items():
        torch.testing.assert_close(fsdp_weights[name], ref, rtol=1e-4, atol=1e-5, msg=name)
        moved = max(moved, float((ref - init[name]).abs().max()))
    assert moved > 1e-3, "the update did not change the weights: the comparison would be vacuous"
