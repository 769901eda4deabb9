"""The non-finite guards (learner/compute/finite.py) on a tiny random Qwen2, in one process and on 2
gloo ranks: an update with a NaN loss or gradient is not applied and is counted; weights that
a step made non-finite are caught; a checkpoint with a NaN/inf weight is refused and the
previous one stays the newest; every decision is the same on every rank.

Run by pytest; the same file is the torchrun script of the 2-rank test (``__main__``).
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asyncrl.core.config.load import ConfigError, load_config
from asyncrl.core.runtime import faults
from asyncrl.learner.compute.finite import NonFiniteError, NonFiniteGuard, nonfinite_models
from asyncrl.learner.compute.model import build_policy, full_named_tensors
from asyncrl.learner.compute.step import StepContext, train_on_batch
from asyncrl.learner.state.checkpoint import latest_checkpoint, save_checkpoint

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[3]))  # tests.random_groups, under torchrun too
from test_step_critic import _batch, _context  # noqa: E402

NAN, INF = float("nan"), float("inf")


@pytest.fixture
def nan_loss(monkeypatch):
    """Arm the ``learner.nan_loss`` failpoint (every policy update) in this process."""
    monkeypatch.setenv(faults.ENV, "learner.nan_loss=on@0")
    faults.reset()
    yield
    monkeypatch.delenv(faults.ENV)
    faults.reset()


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in full_named_tensors(model)}


def _same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_a_nan_loss_skips_the_update_and_counts_it(tiny_model, nan_loss, monkeypatch):
    torch.set_num_threads(1)
    ctx = _context(tiny_model, load_config([]).algorithm)
    before = _weights(ctx.model)
    metrics = train_on_batch(ctx, _batch())
    assert metrics["nonfinite_updates"] == 1.0
    assert math.isnan(metrics["loss"]) and math.isnan(metrics["grad_norm"])
    assert _same(_weights(ctx.model), before), "a NaN update changed the weights"
    assert not ctx.optimizer.state, "Adam's moments saw the NaN gradient"
    assert all(p.grad is None for p in ctx.model.parameters()), "NaN gradients kept"
    monkeypatch.setenv(faults.ENV, "")  # disarmed: the next step trains
    faults.reset()
    metrics = train_on_batch(ctx, _batch())
    assert metrics["nonfinite_updates"] == 0.0 and math.isfinite(metrics["loss"])
    assert not _same(_weights(ctx.model), before), "a finite update was not applied"


def test_a_nan_critic_update_is_skipped_alone(tiny_model):
    """PPO with a critic: NaN returns poison the critic's update only; the policy's stands."""
    torch.set_num_threads(1)
    ctx = _context(tiny_model, load_config(["algorithm=ppo"]).algorithm)
    batch, critic = _batch(), ctx.critic
    old = critic.values(batch.input_ids, batch.attention_mask)
    before = _weights(critic.model)
    m = critic.update(batch, old, torch.full_like(old, NAN), batch.loss_mask, world=1)
    assert m["critic_nonfinite_updates"] == 1.0 and math.isnan(m["value_loss"])
    assert _same(_weights(critic.model), before)
    m = critic.update(batch, old, torch.ones_like(old), batch.loss_mask, world=1)
    assert m["critic_nonfinite_updates"] == 0.0
    assert not _same(_weights(critic.model), before)
    metrics = train_on_batch(ctx, batch)  # the step counts policy and critic updates together
    assert metrics["nonfinite_updates"] == 0.0


def test_guard_fails_after_max_steps_in_a_row_and_a_good_step_resets_it():
    bad = {"loss": NAN, "grad_norm": NAN, "nonfinite_updates": 1.0}
    good = {"loss": 0.5, "grad_norm": 0.25, "nonfinite_updates": 0.0}
    guard = NonFiniteGuard(3)
    assert [guard.check(s, m, []) for s, m in enumerate([bad, bad, good, bad, bad])] == [None] * 5
    message = guard.check(5, bad, [])
    assert message == (
        "3 steps in a row had a non-finite update (learner.max_nonfinite_steps=3), the last at "
        "step 5: non-finite loss, grad_norm (loss=nan, grad_norm=nan); 1 update(s) of that step "
        "were skipped, not applied"
    )
    assert guard.in_a_row == 3


def test_guard_names_the_critic_metric_and_broken_weights():
    critic_bad = {"loss": 0.5, "grad_norm": 0.25, "value_loss": INF, "nonfinite_updates": 1.0}
    assert "non-finite value_loss (loss=0.5, grad_norm=0.25, value_loss=inf)" in NonFiniteGuard(
        1
    ).check(7, critic_bad, [])
    finite = {"loss": 0.5, "grad_norm": 0.25, "nonfinite_updates": 0.0}
    message = NonFiniteGuard(3).check(2, finite, ["policy"])  # fails at once, not counted
    assert message.startswith("step 2 made the policy weights non-finite (NaN/inf)"), message
    assert "lower learner.lr" in message
    with pytest.raises(ValueError, match="max_in_a_row must be >= 1"):
        NonFiniteGuard(0)


def test_max_nonfinite_steps_is_validated():
    assert load_config([]).learner.max_nonfinite_steps == 3
    with pytest.raises(ConfigError, match=r"learner\.max_nonfinite_steps must be >= 1"):
        load_config(["learner.max_nonfinite_steps=0"])


def test_a_huge_lr_makes_weights_non_finite_from_finite_gradients(tiny_model):
    """AdamW, lr=3e37 (its first step, lr / (1 - beta1), stays under float32's max), weight
    decay 11: loss and gradient norm are finite, so the update is applied, and
    ``p (1 - lr wd) - lr sign(g)`` overflows float32 for the norm weights (p = 1): only the
    weight check can catch it."""
    torch.set_num_threads(1)
    ctx = _context(tiny_model, load_config([]).algorithm)
    ctx.optimizer = torch.optim.AdamW(ctx.model.parameters(), lr=3e37, weight_decay=11.0)
    assert nonfinite_models({"policy": ctx.model}) == []
    metrics = train_on_batch(ctx, _batch())
    assert metrics["nonfinite_updates"] == 0.0 and math.isfinite(metrics["grad_norm"])
    assert nonfinite_models({"policy": ctx.model}) == ["policy"]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP in one process
def test_a_checkpoint_with_non_finite_weights_is_refused(tiny_model, tmp_path):
    torch.set_num_threads(1)
    ctx = _context(tiny_model, load_config(["algorithm=ppo"]).algorithm)
    extra = {"critic": (ctx.critic.model, ctx.critic.optimizer)}
    good = save_checkpoint(tmp_path, 1, ctx.model, ctx.optimizer, {"version": 1}, tiny_model,
                           extra=extra)  # fmt: skip
    with torch.no_grad():
        ctx.critic.model.head.bias.fill_(NAN)
    with pytest.raises(NonFiniteError, match="refusing to write checkpoint .*step_000002: the "
                       "critic weights are non-finite"):  # fmt: skip
        save_checkpoint(tmp_path, 2, ctx.model, ctx.optimizer, {"version": 2}, tiny_model,
                        extra=extra)  # fmt: skip
    assert latest_checkpoint(tmp_path) == good
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001"]


def test_two_ranks_take_the_same_decisions(tiny_model, tmp_path):
    """Rank 1 alone sees a NaN loss, a NaN weight, a flag: both ranks skip the update, find
    the weights broken, refuse the checkpoint and fail with rank 0's message."""
    from asyncrl.core.runtime.torchrun import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", __file__, tiny_model,
           str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, r in enumerate(results):
        assert r["skipped"] == [1.0, 0.0], (rank, r)
        assert r["unchanged_after_nan"] and r["changed_after_clean"], (rank, r)
        assert r["flags"] == [True, False] and r["text"] == "from rank 0", (rank, r)
        assert r["broken"] == ["policy"] and r["refused"], (rank, r)
    assert latest_checkpoint(tmp_path) is None


def main():
    """torchrun script: each rank writes what it decided to ``rank<r>.json``."""
    from asyncrl.learner.compute.finite import any_rank
    from asyncrl.learner.trainer import _rank0_text, init_distributed

    model_dir, out = sys.argv[1:3]
    rank = int(os.environ["RANK"])
    if rank == 1:  # rank 1's first policy update gets a NaN loss, rank 0's does not
        os.environ[faults.ENV] = "learner.nan_loss=on@1"
    init_distributed()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    algo = load_config([]).algorithm
    model = build_policy(model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ctx = StepContext(model, opt, algo, rank, 2, 1.0, max_tokens=5)
    before = _weights(model)
    skipped = [train_on_batch(ctx, _batch())["nonfinite_updates"]]
    unchanged = _same(_weights(model), before)
    skipped.append(train_on_batch(ctx, _batch())["nonfinite_updates"])
    changed = not _same(_weights(model), before)
    flags = any_rank([rank == 1, False])
    text = _rank0_text("from rank 0" if rank == 0 else "")
    if rank == 1:  # a NaN in rank 1's shard only
        shard = next(p.to_local() for p in model.parameters() if p.to_local().numel())
        with torch.no_grad():
            shard.view(-1)[0] = NAN
    broken = nonfinite_models({"policy": model})
    try:
        save_checkpoint(out, 3, model, opt, {"version": 3}, model_dir)
        refused = False
    except NonFiniteError:
        refused = True
    result = {"skipped": skipped, "unchanged_after_nan": unchanged, "changed_after_clean": changed,
              "flags": flags, "text": text, "broken": broken, "refused": refused}  # fmt: skip
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    from asyncrl.learner.main import exit_now

    main()
    exit_now(0)  # gloo's teardown race at interpreter exit (SIGABRT), as in learner/main.py
