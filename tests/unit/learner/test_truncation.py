"""Completions cut at the length limit: ``response/clip_ratio`` counts
them, ``algorithm.truncated`` keeps, masks or penalizes them (learner/algo/truncation.py).

Closed forms worked by hand for the pure functions and the aggregation; then the real step on
a tiny model: masking a whole group gives exactly the update of the batch without it, for every
aggregation mode, with and without micro-batches (gradient accumulation)."""

import pytest
import torch

from asyncrl.core.config.job import AlgorithmConfig
from asyncrl.core.config.load import load_config
from asyncrl.core.types import Group
from asyncrl.learner.algo.aggregation import aggregate, make_aggregation
from asyncrl.learner.algo.targets import compute_targets
from asyncrl.learner.algo.truncation import (
    TRUNCATION_MODES,
    clip_ratio,
    truncated_loss_mask,
    truncated_rewards,
)
from asyncrl.learner.compute.batch import collate
from asyncrl.learner.compute.model import build_policy
from asyncrl.learner.compute.step import StepContext, batch_metrics, train_on_batch
from tests.random_groups import random_groups

NAN = float("nan")

# -- pure functions ------------------------------------------------------------------------


def test_every_mode_the_config_accepts_is_one_the_learner_applies():
    """The names live once, in core (asyncrl/core/config/algorithm.py); each is used here."""
    assert TRUNCATION_MODES == ("keep", "mask", "penalize")
    rewards, cut = torch.tensor([1.0, 0.5]), torch.tensor([True, False])
    for mode in TRUNCATION_MODES:
        load_config([f"algorithm.truncated={mode}"])
        assert truncated_rewards(rewards, cut, mode, -1.0).shape == rewards.shape
    with pytest.raises(ValueError, match="not in"):
        truncated_rewards(rewards, cut, "drop", -1.0)


def test_clip_ratio_is_the_fraction_of_cut_rows():
    assert clip_ratio(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])) == pytest.approx(0.6)
    assert clip_ratio(torch.zeros(4)) == 0.0
    assert clip_ratio(torch.zeros(0)) == 0.0


def test_penalize_replaces_the_cut_rows_rewards_and_the_others_leave_them():
    rewards, cut = torch.tensor([1.0, 0.5, 0.0, 1.0]), torch.tensor([1.0, 0.0, 0.0, 1.0])
    got = truncated_rewards(rewards, cut, "penalize", -0.5)
    assert got.tolist() == [-0.5, 0.5, 0.0, -0.5]
    assert rewards.tolist() == [1.0, 0.5, 0.0, 1.0]  # not in place
    for mode in ("keep", "mask"):
        assert truncated_rewards(rewards, cut, mode, -0.5) is rewards
    with pytest.raises(ValueError, match="'drop' not in"):
        truncated_rewards(rewards, cut, "drop", 0.0)


def test_mask_zeroes_the_cut_rows_of_the_loss_mask_only():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    cut = torch.tensor([0.0, 1.0, 0.0])
    got = truncated_loss_mask(mask, cut, "mask")
    assert got.tolist() == [[1, 1, 0], [0, 0, 0], [0, 1, 1]]
    for mode in ("keep", "penalize"):
        assert truncated_loss_mask(mask, cut, mode) is mask
    with pytest.raises(ValueError, match="not in"):
        truncated_loss_mask(mask, cut, "Mask")


# Three rows, T = 3; row 1 is cut and holds NaN where the loss mask is 1.
VALUES = [[1.0, 2.0, 3.0], [NAN, 50.0, 60.0], [7.0, 8.0, 9.0]]
MASK = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 1.0]]
CUT = [0.0, 1.0, 0.0]
# kept: row 0 tokens {1, 2} (sum 3, L 2), row 2 tokens {8, 9} (sum 17, L 2); max_len 4
BY_HAND = {
    "token_mean": (1 + 2 + 8 + 9) / 4,
    "seq_mean_token_sum": (3 + 17) / 2,
    "seq_mean_token_mean": (3 / 2 + 17 / 2) / 2,
    "seq_mean_token_sum_norm": (3 + 17) / (2 * 4),
}


@pytest.mark.parametrize("mode", sorted(BY_HAND))
def test_a_masked_row_is_in_no_denominator_and_gets_no_gradient(mode):
    """The loss is the kept rows' loss with the kept rows' denominators, also summed over
    micro-batches ({0, 1}, {2}); the cut row's gradient is exactly 0 (and its NaN ignored)."""
    values = torch.tensor(VALUES, dtype=torch.float64, requires_grad=True)
    mask = truncated_loss_mask(torch.tensor(MASK, dtype=torch.float64), torch.tensor(CUT), "mask")
    agg = make_aggregation(mode, mask, max_len=4)
    assert (agg.num_tokens, agg.num_seqs) == (4, 2)
    whole = aggregate(values, mask, agg)
    parts = aggregate(values[:2], mask[:2], agg) + aggregate(values[2:], mask[2:], agg)
    assert float(whole.detach()) == pytest.approx(BY_HAND[mode], rel=1e-12)
    assert float(parts.detach()) == pytest.approx(BY_HAND[mode], rel=1e-12)
    (grad,) = torch.autograd.grad(whole, values)
    assert torch.all(grad[1] == 0)
    kept = torch.tensor(MASK)[[0, 2]] != 0
    assert torch.all(grad[[0, 2]][kept] > 0) and torch.all(grad[[0, 2]][~kept] == 0)


# -- rewards -> advantages -----------------------------------------------------------------

REWARDS = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
T_MASK = torch.tensor(
    [[0, 1, 1, 0], [0, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float32
)  # lengths 2, 3, 2, 4
ROWS_CUT = torch.tensor([1.0, 0.0, 0.0, 1.0])


def _seq(adv):
    return [float(row[m.bool()][0]) for row, m in zip(adv, T_MASK, strict=True)]


def test_penalize_replaces_the_reward_before_the_group_baseline():
    algo = AlgorithmConfig(advantage="dr_grpo", truncated="penalize", truncated_reward=-1.0)
    t = compute_targets(algo, REWARDS, T_MASK, truncated=ROWS_CUT)
    # shaped g0 [-1, 0] mean -.5 -> [-.5, .5]; g1 [.5, -1] mean -.25 -> [.75, -.75]
    assert _seq(t.advantages) == pytest.approx([-0.5, 0.5, 0.75, -0.75], abs=1e-6)


@pytest.mark.parametrize("mode", ["keep", "mask"])
def test_keep_and_mask_leave_the_advantages_alone(mode):
    """Under mask a cut sample's reward still counts in its group's baseline (as TRL's
    mask_truncated_completions); only the loss mask changes, in the step."""
    t = compute_targets(
        AlgorithmConfig(advantage="dr_grpo", truncated=mode), REWARDS, T_MASK, truncated=ROWS_CUT
    )
    assert _seq(t.advantages) == pytest.approx([0.5, -0.5, 0.0, 0.0], abs=1e-6)


def test_the_overlong_penalty_adds_to_the_replaced_reward():
    # max_tokens 4, cache 2: penalties 0, -.5, 0, -1; rows 0, 3 replaced by -1 first:
    # g0 [-1, -.5] mean -.75 -> [-.25, .25]; g1 [.5, -2] mean -.75 -> [1.25, -1.25]
    algo = AlgorithmConfig(advantage="dr_grpo", overlong_frac=0.5, truncated="penalize",
                           truncated_reward=-1.0)  # fmt: skip
    t = compute_targets(algo, REWARDS, T_MASK, max_tokens=4, truncated=ROWS_CUT)
    assert _seq(t.advantages) == pytest.approx([-0.25, 0.25, 1.25, -1.25], abs=1e-6)


# -- config --------------------------------------------------------------------------------


def test_config_accepts_the_modes_and_names_the_fix_otherwise():
    assert AlgorithmConfig().truncated == "keep"
    algo = load_config(["algorithm.truncated=penalize", "algorithm.truncated_reward=-1"]).algorithm
    assert (algo.truncated, algo.truncated_reward) == ("penalize", -1.0)
    with pytest.raises(ValueError, match=r"algorithm.truncated='drop' not in .*keep .*mask"):
        AlgorithmConfig(truncated="drop")
    with pytest.raises(ValueError, match="set algorithm.truncated=penalize"):
        AlgorithmConfig(truncated="mask", truncated_reward=-1.0)


# -- the step on a tiny model --------------------------------------------------------------

VOCAB = 32


def _groups(cut: dict[int, list[int]], n_groups=4, n=4, seed=0) -> list[Group]:
    """Random groups; ``cut[g]`` lists the samples of group g that hit the length limit."""
    return random_groups(n_groups, n, seed, VOCAB, cut)


def _step(model_dir, overrides, groups, micro_batch_rows=0):
    """(metrics, new weights) after one SGD step (lr 0.5, no clipping) on ``groups``."""
    torch.manual_seed(0)
    model = build_policy(model_dir)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    algo = load_config(overrides).algorithm
    ctx = StepContext(model, opt, algo, 0, 1, grad_clip=1e9, max_tokens=5,
                      micro_batch_rows=micro_batch_rows)  # fmt: skip
    metrics = train_on_batch(ctx, collate(groups))
    return metrics, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same(a, b):
    for name, ref in a.items():
        torch.testing.assert_close(b[name], ref, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("micro_batch_rows", [0, 3])
@pytest.mark.parametrize(
    "aggregation",
    ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm"],
)
def test_masking_a_group_equals_training_without_it(tiny_model, aggregation, micro_batch_rows):
    """Group 1 cut whole: its advantages cannot touch the other groups', so the masked step
    on 4 groups must be the kept step on groups 0, 2, 3 (same denominators, same gradient),
    also accumulated over micro-batches of 3 rows. ``keep`` on 4 groups differs."""
    torch.set_num_threads(1)
    groups = _groups({1: [0, 1, 2, 3]})
    agg = f"algorithm.aggregation={aggregation}"
    masked, w_masked = _step(tiny_model, [agg, "algorithm.truncated=mask"], groups,
                             micro_batch_rows)  # fmt: skip
    without, w_without = _step(tiny_model, [agg], [groups[i] for i in (0, 2, 3)])
    assert masked["tokens"] == without["tokens"] == sum(groups[i].num_tokens for i in (0, 2, 3))
    assert masked["loss"] == pytest.approx(without["loss"], rel=1e-5, abs=1e-7)
    _assert_same(w_without, w_masked)
    kept, w_kept = _step(tiny_model, [agg], groups)
    assert kept["tokens"] == sum(g.num_tokens for g in groups)
    assert any(not torch.allclose(w_kept[k], v, atol=1e-5) for k, v in w_masked.items())


def test_a_masked_sample_still_counts_in_its_groups_baseline(tiny_model):
    """One cut sample in group 3: the masked step is the kept step with that row's loss mask
    zeroed by hand, the advantages taken from all four rewards."""
    torch.set_num_threads(1)
    groups = _groups({3: [2]})
    masked, w_masked = _step(tiny_model, ["algorithm.truncated=mask"], groups)
    torch.manual_seed(0)
    model = build_policy(tiny_model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ctx = StepContext(model, opt, AlgorithmConfig(), 0, 1, grad_clip=1e9, max_tokens=5)
    batch = collate(groups)
    batch.loss_mask[3 * 4 + 2] = 0.0
    by_hand = train_on_batch(ctx, batch)
    assert masked["tokens"] == by_hand["tokens"]
    _assert_same({k: v.detach() for k, v in model.state_dict().items()}, w_masked)


def test_penalize_equals_keep_on_the_replaced_rewards(tiny_model):
    torch.set_num_threads(1)
    groups = _groups({0: [1], 2: [0, 3]})
    penalized, w_pen = _step(
        tiny_model, ["algorithm.truncated=penalize", "algorithm.truncated_reward=-1"], groups
    )
    for g in groups:
        for s in g.samples:
            s.reward = -1.0 if s.finish_reason == "length" else s.reward
    kept, w_kept = _step(tiny_model, [], groups)
    assert penalized["loss"] == pytest.approx(kept["loss"], rel=1e-6)
    _assert_same(w_kept, w_pen)


def test_the_clip_ratio_is_a_batch_metric():
    batch = collate(_groups({0: [1], 2: [0, 3]}))
    assert batch.truncated.tolist() == [0, 1, 0, 0] + [0] * 4 + [1, 0, 0, 1] + [0] * 4
    assert batch_metrics(batch, version=0)["response/clip_ratio"] == pytest.approx(3 / 16)


def test_a_step_whose_completions_are_all_cut_and_masked_is_a_zero_update(tiny_model):
    """Nothing left to train: loss 0, every metric finite (none divides by the 0 tokens), and
    SGD leaves the weights as they were."""
    torch.set_num_threads(1)
    groups = _groups({g: [0, 1, 2, 3] for g in range(4)})
    metrics, weights = _step(tiny_model, ["algorithm.truncated=mask"], groups)
    assert metrics["loss"] == 0.0 and metrics["tokens"] == 0.0
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values()), metrics
    _assert_same(build_policy(tiny_model).state_dict(), weights)
