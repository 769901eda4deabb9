"""asyncrl.learner.algo.targets: rewards -> per-token advantages, checked against values worked by hand."""

import pytest
import torch

from asyncrl.core.config.job import AlgorithmConfig
from asyncrl.learner.algo.targets import compute_targets, overlong_cache_len

# 2 groups x 2 samples; rows 0,1 = group 0; rows 2,3 = group 1. T = 4.
REWARDS = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
MASK = torch.tensor(
    [
        [0, 1, 1, 0],  # 2 completion tokens
        [0, 1, 1, 1],  # 3
        [1, 1, 0, 0],  # 2
        [1, 1, 1, 1],  # 4
    ],
    dtype=torch.float32,
)


def _seq(adv_tokens):
    """The (single) value on each row's masked tokens; checks it is constant over them."""
    out = []
    for row, m in zip(adv_tokens, MASK, strict=True):
        vals = row[m.bool()]
        assert torch.all(vals == vals[0])
        assert torch.all(row[~m.bool()] == 0)
        out.append(float(vals[0]))
    return out


def test_grpo_group_advantages_on_each_rows_tokens():
    t = compute_targets(AlgorithmConfig(advantage="grpo"), REWARDS, MASK)
    # group 0: mean .5, sample std sqrt(.5); group 1: all equal -> 0
    s = 0.5 / (0.5**0.5 + 1e-6)
    assert _seq(t.advantages) == pytest.approx([s, -s, 0.0, 0.0], abs=1e-6)
    assert t.returns is None and t.metrics == {}


def test_std_normalize_reaches_the_estimator():
    t = compute_targets(AlgorithmConfig(advantage="grpo", std_normalize=False), REWARDS, MASK)
    assert _seq(t.advantages) == pytest.approx([0.5, -0.5, 0.0, 0.0], abs=1e-6)


def test_rloo():
    t = compute_targets(AlgorithmConfig(advantage="rloo"), REWARDS, MASK)
    assert _seq(t.advantages) == pytest.approx([1.0, -1.0, 0.0, 0.0], abs=1e-6)


def test_reinforce_pp_batch_whitening_and_group_baseline():
    t = compute_targets(AlgorithmConfig(advantage="reinforce_pp"), REWARDS, MASK)
    # r = [1, 0, .5, .5]: mean .5, sample std sqrt(1/6)
    sd = (1 / 6) ** 0.5 + 1e-6
    assert _seq(t.advantages) == pytest.approx([0.5 / sd, -0.5 / sd, 0, 0], abs=1e-6)
    t = compute_targets(
        AlgorithmConfig(advantage="reinforce_pp", group_baseline=True), REWARDS, MASK
    )
    # x = [.5, -.5, 0, 0]: mean 0, sample std sqrt(1/6)
    assert _seq(t.advantages) == pytest.approx([0.5 / sd, -0.5 / sd, 0, 0], abs=1e-6)


def test_overlong_penalty_is_added_before_the_advantage():
    # max_tokens 4, overlong_frac .5 -> cache 2: lengths 2,3,2,4 -> penalties 0, -.5, 0, -1
    algo = AlgorithmConfig(advantage="dr_grpo", overlong_frac=0.5, overlong_penalty=1.0)
    assert overlong_cache_len(algo, 4) == 2
    t = compute_targets(algo, REWARDS, MASK, max_tokens=4)
    # shaped: g0 [1, -.5] mean .25 -> [.75, -.75]; g1 [.5, -.5] mean 0 -> [.5, -.5]
    assert _seq(t.advantages) == pytest.approx([0.75, -0.75, 0.5, -0.5], abs=1e-6)
    assert t.metrics["overlong_penalty_mean"] == pytest.approx(-1.5 / 4)
    with pytest.raises(ValueError, match="max_tokens"):
        compute_targets(algo, REWARDS, MASK)


def test_kl_reward_penalty_sums_the_masked_tokens_per_sequence():
    kl = torch.full((4, 4), 0.1)
    kl[0, 0] = 100.0  # outside the mask: ignored
    algo = AlgorithmConfig(advantage="dr_grpo", kl_coef=1.0, kl_mode="reward", kl_estimator="k1")
    t = compute_targets(algo, REWARDS, MASK, kl=kl)
    # penalties .2, .3, .2, .4 -> shaped g0 [.8, -.3] -> [.55, -.55]; g1 [.3, .1] -> [.1, -.1]
    assert _seq(t.advantages) == pytest.approx([0.55, -0.55, 0.1, -0.1], abs=1e-6)
    assert t.metrics["kl_reward_mean"] == pytest.approx((0.2 + 0.3 + 0.2 + 0.4) / 4)


def test_gae_uses_the_critic_values_and_per_token_kl():
    algo = AlgorithmConfig(advantage="gae", gamma=1.0, lam=1.0, kl_coef=0.5, kl_mode="reward",
                           kl_estimator="k1")  # fmt: skip
    values = torch.full((4, 4), 0.25)
    kl = torch.full((4, 4), 0.2)
    t = compute_targets(algo, REWARDS, MASK, values=values, kl=kl)
    # gamma = lam = 1: A_t = sum of rewards from t on - V_t; per-token reward -0.1, + R at the end
    # row 0 (R=1, 2 tokens): returns [0.9, 0.9 - 0.1 ... ] -> G_t: t1: 1-.2 = .8, t2: 1-.1 = .9
    assert t.returns[0].tolist() == pytest.approx([0, 0.8, 0.9, 0], abs=1e-6)
    assert t.advantages[0].tolist() == pytest.approx([0, 0.55, 0.65, 0], abs=1e-6)
    # row 3 (R=.5, 4 tokens): G = .5 - .1 * (4, 3, 2, 1)
    assert t.returns[3].tolist() == pytest.approx([0.1, 0.2, 0.3, 0.4], abs=1e-6)
    with pytest.raises(ValueError, match="critic values"):
        compute_targets(algo, REWARDS, MASK)
