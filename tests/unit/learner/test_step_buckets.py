"""Length-bucketed micro-batches (``learner.max_tokens_per_micro_batch``) make the update of the
padded path: same loss, metrics, gradients and new weights, for every policy loss and every
aggregation mode (with pi_prox and pi_ref forwards, entropy and a KL loss), with a critic
(gae, KL in the reward), and on 2 FSDP2 ranks (gloo) whose rows pack into different numbers
of micro-batches. The weights are float64, but log-probs and metric sums may be float32
(``token_logprobs`` upcasts logits to float32): metrics agree to float32 rounding, gradients
to ~1e-15 relative (~1e-7 for gspo, whose sequence ratio is a float32 sum), measured here.

Run by pytest; the same file is the torchrun script of the 2-rank test (``__main__``).
"""

import json
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from asyncrl.core.config.job import Config, LearnerConfig, ModelConfig
from asyncrl.core.config.load import load_config
from asyncrl.core.types import Group, Sample
from asyncrl.learner.algo.aggregation import AGGREGATION_MODES
from asyncrl.learner.algo.losses import POLICY_LOSSES
from asyncrl.learner.algo.targets import uses_critic
from asyncrl.learner.compute import micro_batches, step
from asyncrl.learner.compute.batch import collate
from asyncrl.learner.compute.critic import build_critic
from asyncrl.learner.compute.model import build_policy, full_named_tensors
from asyncrl.learner.compute.reference import build_reference
from asyncrl.learner.compute.step import StepContext, train_on_batch

VOCAB = 32  # tests/conftest.py's tiny_model
BUDGET = 24  # tokens: several micro-batches of different widths; the longest rows exceed it
# metrics that depend on how rows are grouped into micro-batches (not only on the rows): ESS
# and p99 are computed per micro-batch and merged approximately, and the plan's own figures
BY_GROUPING = {"is_ess", "is_weight_p99", "micro_batches", "micro_batch_tokens_max",
               "padding_frac"}  # fmt: skip
SEQUENCE_LEVEL = {"is_weight_mean", "is_truncated_frac", "is_masked_frac"}  # per sequence


def long_tailed_batch(n_groups=4, n=4, seed=0, rank0_short=False):
    """Prompts of 2-5 tokens, completions ~ 1 + Exp(mean 8) capped at 40: a few long rows
    and many short ones. ``rank0_short``: the even groups, which are rank 0's share of each
    of 2 minibatches on 2 ranks, get 1-3 completion tokens, so the ranks pack differently."""
    rng = random.Random(seed)
    groups = []
    for g in range(n_groups):
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 5))]
        short = rank0_short and g % 2 == 0
        samples = []
        for _ in range(n):
            c = rng.randint(1, 3) if short else min(40, 1 + int(rng.expovariate(1 / 8)))
            samples.append(Sample(prompt, [rng.randrange(1, VOCAB) for _ in range(c)],
                                  [-rng.uniform(0.5, 4.0) for _ in range(c)], [0] * c,
                                  float(rng.random() < 0.5)))  # fmt: skip
        groups.append(Group(f"g{g}", g, 0, samples))
    return collate(groups)


def one_step(model_dir, algo, budget, rank=0, world=1, batch=None, dtype=torch.float64,
             packed=False, attn="auto"):  # fmt: skip
    """(metrics, policy and critic gradients of the last update, policy weights) after one
    step with SGD (lr 0.5, no clipping); ``dtype`` of the weights (float32 under FSDP2);
    ``packed``: every model runs packed streams (asyncrl.learner.compute.packing) with attention ``attn``."""
    torch.manual_seed(0)
    cfg = Config(
        model=ModelConfig(attn_implementation=attn),
        algorithm=replace(algo, critic_lr=0.5),
        learner=LearnerConfig(grad_clip=1e9),
    )
    model = build_policy(model_dir, cfg, packed=packed).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ref = None
    if algo.kl_coef > 0:
        ref = build_reference(model_dir, cfg, packed=packed).to(dtype)
    critic = None
    if uses_critic(algo.advantage):
        critic = build_critic(model_dir, cfg, packed=packed)
        critic.model.to(dtype)
        critic.optimizer = torch.optim.SGD(critic.model.parameters(), lr=0.5)
    ctx = StepContext(model, opt, algo, rank, world, 1e9, critic=critic, reference=ref,
                      max_tokens=40, max_tokens_per_micro_batch=budget,
                      pack_sequences=packed)  # fmt: skip
    metrics = train_on_batch(ctx, long_tailed_batch() if batch is None else batch)
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    if critic is not None:
        grads |= {f"critic.{k}": p.grad.clone() for k, p in critic.model.named_parameters()}
    weights = {k: v.clone() for k, v in full_named_tensors(model)}
    return metrics, grads, weights


def untrimmed(monkeypatch):
    """The step's planner with every micro-batch kept at the batch's full width: the bucketed
    grouping on the padded grid, to compare the grouping-dependent metrics too."""
    plan = micro_batches.plan_micro_batches

    def full_width(attention_mask, *args):
        width = attention_mask.shape[1]
        return [micro_batches.MicroBatch(m.index, width) for m in plan(attention_mask, *args)]

    monkeypatch.setattr(step, "plan_micro_batches", full_width)


def assert_same(got, want, keys, grads=None, want_grads=None):
    for key in keys:
        assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-7), key
    for name, ref in (want_grads or {}).items():
        torch.testing.assert_close(grads[name], ref, rtol=1e-5, atol=1e-8, msg=name)


CASES = [(loss, mode) for loss in POLICY_LOSSES for mode in AGGREGATION_MODES]


def loss_case(loss: str, mode: str):
    """(algorithm, is_level) of a loss x aggregation case: 2 minibatches, entropy and a k3
    KL loss, sequence-level behaviour weights for the sequence losses."""
    level = "sequence" if loss in ("gspo", "masked_is") else "token"
    algo = load_config([f"algorithm.policy_loss={loss}", f"algorithm.aggregation={mode}",
                        "algorithm.minibatches=2", "algorithm.entropy_coef=0.01",
                        "algorithm.kl_coef=0.05", "algorithm.kl_estimator=k3",
                        f"algorithm.is_level={level}"]).algorithm  # fmt: skip
    return algo, level


@pytest.mark.parametrize(("loss", "mode"), CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_bucketed_step_equals_the_padded_step(tiny_model, monkeypatch, loss, mode):
    torch.set_num_threads(1)
    algo, level = loss_case(loss, mode)
    padded, g_padded, w_padded = one_step(tiny_model, algo, 0)
    bucketed, g_bucketed, w_bucketed = one_step(tiny_model, algo, BUDGET)
    assert bucketed["micro_batches"] > 2 and padded["micro_batches"] == 1
    assert bucketed["padding_frac"] < padded["padding_frac"]
    assert bucketed["micro_batch_tokens_max"] > BUDGET  # a row longer than the budget ran
    assert set(bucketed) == set(padded)
    invariant = set(padded) - BY_GROUPING - (SEQUENCE_LEVEL if level == "sequence" else set())
    assert {"loss", "pg_loss", "kl_loss", "entropy_loss", "grad_norm", "kl_ref"} <= invariant
    assert_same(bucketed, padded, invariant, g_bucketed, g_padded)
    for name, ref in w_padded.items():
        torch.testing.assert_close(w_bucketed[name], ref, rtol=1e-6, atol=1e-9, msg=name)
    # trimming alone changes nothing, not even the grouping-dependent metrics
    untrimmed(monkeypatch)
    same_groups, g_same, _ = one_step(tiny_model, algo, BUDGET)
    assert same_groups["padding_frac"] > bucketed["padding_frac"]
    assert_same(bucketed, same_groups, set(padded) - {"padding_frac", "micro_batch_tokens_max"},
                g_bucketed, g_same)  # fmt: skip


PACKED_CASES = [(loss, mode, attn) for loss, mode in CASES for attn in ("sdpa", "eager")
                if attn == "sdpa" or loss == "ppo"]  # fmt: skip


@pytest.mark.parametrize(("loss", "mode", "attn"), PACKED_CASES,
                         ids=["-".join(c) for c in PACKED_CASES])  # fmt: skip
def test_packed_step_equals_the_padded_step(tiny_model, loss, mode, attn):
    """The packed path (each micro-batch one stream of real tokens with a document mask,
    asyncrl.learner.compute.packing) makes the padded path's update: the rows' tokens see only their own row."""
    torch.set_num_threads(1)
    algo, level = loss_case(loss, mode)
    padded, g_padded, w_padded = one_step(tiny_model, algo, 0)
    packed, g_packed, w_packed = one_step(tiny_model, algo, BUDGET, packed=True, attn=attn)
    assert packed["padding_frac"] == 0 and padded["padding_frac"] > 0.3
    assert packed["micro_batches"] > 2 and packed["micro_batch_tokens_max"] > BUDGET
    invariant = set(padded) - BY_GROUPING - (SEQUENCE_LEVEL if level == "sequence" else set())
    assert {"loss", "pg_loss", "kl_loss", "entropy_loss", "grad_norm", "kl_ref"} <= invariant
    assert_same(packed, padded, invariant, g_packed, g_padded)
    for name, ref in w_padded.items():
        torch.testing.assert_close(w_packed[name], ref, rtol=1e-6, atol=1e-9, msg=name)


def test_packed_micro_batches_count_real_tokens():
    lengths = [10, 9, 3, 3, 2]
    assert micro_batches.token_groups(lengths, 12) == [[0], [1], [2, 3, 4]]  # padded: 3 x 3
    assert micro_batches.token_groups(lengths, 12, packed=True) == [[0, 4], [1, 2], [3]]
    plan = micro_batches.plan_micro_batches(
        torch.tensor([[1] * n + [0] * (10 - n) for n in lengths]), 0, 12, 1, packed=True
    )
    assert [m.padded_tokens for m in plan] == [12, 12, 3]  # the streams' lengths
    assert [m.width for m in plan] == [10, 9, 3]


@pytest.mark.parametrize("packed", [False, True], ids=["bucketed", "packed"])
def test_bucketed_step_with_a_critic_equals_the_padded_step(tiny_model, packed):
    """ppo preset: GAE from V_old (no-grad critic forwards, scattered back), the KL penalty in
    the reward (pi_ref forwards), two minibatches, the critic's update accumulated too."""
    torch.set_num_threads(1)
    algo = load_config(["algorithm=ppo", "algorithm.ppo_epochs=2"]).algorithm
    padded, g_padded, w_padded = one_step(tiny_model, algo, 0)
    bucketed, g_bucketed, w_bucketed = one_step(tiny_model, algo, BUDGET, packed=packed)
    assert bucketed["micro_batches"] > 2
    keys = set(padded) - BY_GROUPING
    assert {"value_loss", "critic_grad_norm", "value_explained_var", "kl_reward_mean"} <= keys
    assert_same(bucketed, padded, keys, g_bucketed, g_padded)
    assert any(k.startswith("critic.") for k in g_padded)
    assert float(g_padded["critic.head.weight"].abs().max()) > 1e-4, "the critic did not learn"
    for name, ref in w_padded.items():
        torch.testing.assert_close(w_bucketed[name], ref, rtol=1e-6, atol=1e-9, msg=name)


def test_row_longer_than_the_budget_is_said_once(tiny_model):
    torch.set_num_threads(1)
    algo = load_config([]).algorithm
    lines, model = [], build_policy(tiny_model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ctx = StepContext(model, opt, algo, 0, 1, 1e9, max_tokens=40,
                      max_tokens_per_micro_batch=BUDGET, say=lines.append)  # fmt: skip
    for _ in range(2):
        train_on_batch(ctx, long_tailed_batch())
    assert (
        len(lines) == 1 and f"longer than learner.max_tokens_per_micro_batch={BUDGET}" in lines[0]
    )


@pytest.mark.parametrize("packed", [False, True], ids=["bucketed", "packed"])
def test_two_ranks_with_different_micro_batch_counts_match_one_process(
    tiny_model, tmp_path, packed
):
    """Rank 0 holds short rows (one micro-batch), rank 1 long ones (several): rank 0 splits
    its micro-batches to rank 1's count, so FSDP2's collectives match, and the update equals
    the one-process padded update (bucketed, or packed streams under FSDP2)."""
    from asyncrl.core.runtime.torchrun import free_port

    batch = long_tailed_batch(rank0_short=True)
    algo = load_config(["algorithm=ppo"]).algorithm  # critic, pi_ref, 2 minibatches
    # minibatch 0 is rows 0-7: rank 0 holds rows 0-3, rank 1 rows 4-7
    lengths = [batch.attention_mask[r].sum(-1).tolist() for r in (slice(0, 4), slice(4, 8))]
    counts = [len(micro_batches.token_groups(n, BUDGET, packed)) for n in lengths]
    assert counts[0] < counts[1], counts  # the ranks' own plans differ
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", __file__, tiny_model,
           str(tmp_path), str(packed)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    torch.set_num_threads(1)
    padded, _, weights = one_step(tiny_model, algo, 0, batch=batch, dtype=torch.float32)
    got = json.loads((tmp_path / "result.json").read_text())
    assert got["micro_batches"] == [counts[1], counts[1]]  # both ranks ran rank 1's count
    # explained variance is per rank, then averaged: it depends on the ranks' rows
    for key in set(padded) - BY_GROUPING - {"value_explained_var"}:
        assert got["metrics"][key] == pytest.approx(padded[key], rel=1e-5, abs=1e-7), key
    for name, ref in weights.items():
        torch.testing.assert_close(torch.tensor(got["weights"][name], dtype=ref.dtype), ref,
                                   rtol=1e-5, atol=1e-7, msg=name)  # fmt: skip


def main():
    from asyncrl.learner.compute.step import reduce_metrics
    from asyncrl.learner.trainer import init_distributed

    model_dir, out, packed = sys.argv[1], sys.argv[2], sys.argv[3] == "True"
    rank, world = init_distributed()
    torch.set_num_threads(1)
    algo = load_config(["algorithm=ppo"]).algorithm
    counts = []
    plan = step.plan_micro_batches

    def recorded(*args):  # the counts each rank ran in its first minibatch
        result = plan(*args)
        counts.append(len(result))
        return result

    step.plan_micro_batches = recorded
    batch = long_tailed_batch(rank0_short=True)
    metrics, _, weights = one_step(model_dir, algo, BUDGET, rank, world, batch, torch.float32,
                                   packed=packed)  # fmt: skip
    metrics = reduce_metrics(metrics, world)
    mine = torch.tensor([counts[0]])
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    if rank == 0:
        doc = {"metrics": metrics, "micro_batches": [int(c) for c in every],
               "weights": {k: v.tolist() for k, v in weights.items()}}  # fmt: skip
        Path(out, "result.json").write_text(json.dumps(doc))
    dist.destroy_process_group()


if __name__ == "__main__":
    from asyncrl.learner.main import exit_now

    main()
    exit_now(0)  # gloo's teardown race at interpreter exit (SIGABRT), as in learner/main.py
