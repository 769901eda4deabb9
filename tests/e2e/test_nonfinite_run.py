"""A real ``asyncrl run`` (torchrun learner, simulated actor, private redis-server) that goes
non-finite, or trains nothing, fails: exit non-zero, the FAILED line says why, and no
checkpoint holds a NaN/inf tensor.

- NaN losses (the test-only failpoint ``learner.nan_loss``) at steps 1, 3, 4, 5: each update
  is skipped and counted; the third in a row fails the run naming the step, its groups and
  the metric; the checkpoints written before (steps 2 and 4) are finite.
- AdamW with lr=3.4e37 and weight decay 10: the first update, from finite gradients, makes
  the weights inf; the run fails at that step, before any weight sync or checkpoint.
- ``learner.max_wall_s=0.001``: the clock runs out before the first step; the run fails
  instead of exiting 0 with an untrained "checkpoint".
- One NaN step only: skipped, the run exits 0, and the summary counts it.
"""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from tests.e2e.conftest import REPO, asyncrl_cmd

pytestmark = [pytest.mark.slow, pytest.mark.redis]

COMMON = ["run", "experiment=tiny", "actor.engine=sim", "metrics_port=0"]


def _run(run_dir: Path, *overrides: str, failpoints: str = "") -> tuple[int, str]:
    if shutil.which("redis-server") is None:
        pytest.skip("install redis-server (apt-get install -y redis-server) to run this test")
    env = dict(os.environ, PYTHONUNBUFFERED="1", ASYNCRL_FAILPOINTS=failpoints)
    proc = subprocess.run(asyncrl_cmd(*COMMON, f"run_dir={run_dir}", *overrides), cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=100)  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


def _failed_line(out: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith("[asyncrl] FAILED:")]
    assert lines, out[-4000:]
    return lines[0]


def _checkpoint_tensors(path: Path):
    """(name, tensor) of a checkpoint's DCP state (models and optimizers) and HF export."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    flat = path.parent / f"{path.name}.pt"
    dcp_to_torch_save(path / "dcp", flat)
    stack = [("dcp", torch.load(flat, weights_only=False))]
    while stack:
        name, x = stack.pop()
        if isinstance(x, torch.Tensor):
            yield name, x
        elif isinstance(x, dict):
            stack.extend((f"{name}/{k}", v) for k, v in x.items())
        elif isinstance(x, list | tuple):
            stack.extend((f"{name}/{i}", v) for i, v in enumerate(x))
    yield from load_file(path / "hf" / "model.safetensors").items()


@pytest.mark.timeout(150)
def test_nan_losses_in_a_row_fail_the_run_and_no_checkpoint_is_non_finite(tmp_path):
    run_dir, trace = tmp_path / "run", tmp_path / "reads.jsonl"
    nan_steps = (1, 3, 4, 5)  # hit n = step n-1 (one policy update per step)
    failpoints = ",".join(f"learner.nan_loss=on@{s + 1}" for s in nan_steps)
    failpoints += f",learner.after_read=trace:{trace}@0"
    code, out = _run(run_dir, "learner.steps=8", "learner.max_nonfinite_steps=3",
                     failpoints=failpoints)  # fmt: skip
    assert code != 0, out[-4000:]
    failed = _failed_line(out)
    reads = [json.loads(line) for line in trace.read_text().splitlines()]
    groups = {r["version"]: r["groups"] for r in reads if r["groups"]}  # rank 0 reads them
    expected = (
        "3 steps in a row had a non-finite update (learner.max_nonfinite_steps=3), the last at "
        "step 5: non-finite loss, grad_norm (loss=nan, grad_norm=nan); 1 update(s) of that step "
        f"were skipped, not applied; the step's groups: {', '.join(groups[5])}; 4 step(s) of "
        "this run skipped updates; newest checkpoint: "
    )
    assert expected in failed, failed
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    skipped = [r["nonfinite_updates"] for r in records]
    assert skipped == [0.0, 1.0, 0.0, 1.0, 1.0, 1.0], skipped  # the failed step's record too
    ckpts = sorted((run_dir / "checkpoints").glob("step_*"))
    assert [p.name for p in ckpts] == ["step_000002", "step_000004"], ckpts
    assert f"newest checkpoint: {ckpts[-1]} (none is written" in failed, failed
    for ckpt in ckpts:
        tensors = list(_checkpoint_tensors(ckpt))
        assert len(tensors) > 100, (ckpt, len(tensors))
        bad = [n for n, t in tensors if t.is_floating_point() and not torch.isfinite(t).all()]
        assert not bad, (ckpt, bad)
    print(f"\nNaN at steps {nan_steps}: exit {code}, {len(ckpts)} finite checkpoints\n{failed}")


@pytest.mark.timeout(150)
def test_weights_made_non_finite_fail_the_run_before_a_sync_or_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    # learner.lr is bounded (<= 1); a weight decay of 1e300 makes AdamW's
    # decay factor (1 - lr * wd) -inf in float32, so the first step's weights are non-finite
    code, out = _run(run_dir, "learner.nproc=1", "learner.steps=4", "learner.lr=1",
                     "learner.weight_decay=1e300", "learner.warmup_steps=0")  # fmt: skip
    assert code != 0, out[-4000:]
    failed = _failed_line(out)
    assert "step 0 made the policy weights non-finite (NaN/inf)" in failed, failed
    assert "lower learner.lr" in failed and "newest checkpoint: none yet" in failed, failed
    assert not list((run_dir / "checkpoints").glob("*")), "a checkpoint was written"
    actor_log = (run_dir / "actor0.log").read_text()
    assert re.search(r"final weights v0 \(0 syncs", actor_log), actor_log[-2000:]
    print(f"\nweights inf after step 0: exit {code}, no sync, no checkpoint\n{failed}")


@pytest.mark.timeout(150)
def test_a_run_that_trains_no_step_fails(tmp_path):
    run_dir = tmp_path / "run"
    code, out = _run(run_dir, "learner.nproc=1", "learner.steps=4", "learner.max_wall_s=0.001")
    assert code != 0, out[-4000:]
    failed = _failed_line(out)
    assert "no step was trained: learner.max_wall_s=0.001 ran out after" in failed, failed
    assert not list((run_dir / "checkpoints").glob("*")), "an untrained checkpoint was written"
    print(f"\nmax_wall_s=0.001: exit {code}\n{failed}")


@pytest.mark.timeout(150)
def test_a_skipped_step_is_counted_and_the_run_goes_on(tmp_path):
    """One NaN step (fewer than max_nonfinite_steps in a row): skipped, the run exits 0, and
    the summary says so; its groups count as trained (the step consumed them)."""
    run_dir = tmp_path / "run"
    code, out = _run(run_dir, "learner.nproc=1", "learner.steps=4",
                     failpoints="learner.nan_loss=on@2")  # fmt: skip
    assert code == 0, out[-4000:]
    s = json.loads((run_dir / "summary.json").read_text())
    assert (s["steps_nonfinite_skipped"], s["updates_nonfinite_skipped"]) == (1, 1), s
    assert s["steps"] == 4 and s["groups_trained"] == 4 * 4, s  # experiment=tiny: 4 groups
    dropped = sum(v for k, v in s.items() if k.startswith("groups_dropped_"))
    assert s["groups_committed"] == s["groups_trained"] + dropped + s["groups_still_buffered"], s
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["nonfinite_updates"] for r in records] == [0.0, 1.0, 0.0, 0.0], records


@pytest.mark.timeout(150)
def test_weights_that_explode_but_stay_finite_fail_the_run_naming_the_lr(tmp_path):
    """Formerly, ``learner.lr=1e30`` ran until the weights were 1e29, then failed on NaN steps
    pointing at a checkpoint of those weights. The highest lr accepted now is 1, and at 1 the
    first step's jump in the weights' norm fails the run before a sync or checkpoint."""
    run_dir = tmp_path / "run"
    reward = tmp_path / "parity.py"  # the simulated engine's random answers all score 0 on
    reward.write_text(
        "def reward(prompt, completion, **fields):\n"  # the demo's reward: no
        "    return float(len(completion) % 2)\n"
    )  # gradient, no update
    code, out = _run(run_dir, "learner.nproc=1", "learner.steps=4", "learner.lr=1",
                     "learner.warmup_steps=0", f"task.reward_fn={reward}:reward")  # fmt: skip
    assert code != 0, out[-4000:]
    failed = _failed_line(out)
    assert "step 0 multiplied the policy weights' norm by" in failed, failed
    assert "lower learner.lr" in failed and "newest checkpoint: none yet" in failed, failed
    assert not list((run_dir / "checkpoints").glob("*")), "a checkpoint was written"
