"""Advantage estimators and reward shaping against values computed by hand (tol 1e-6)."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.learner.algo.advantages import (
    ADVANTAGE_ESTIMATORS,
    all_equal_groups,
    dr_grpo,
    gae,
    grpo,
    overlong_penalty,
    place_at_last_token,
    reinforce_pp,
    rloo,
    to_token_level,
    value_loss,
)
from asyncrl.learner.algo.losses import make_aggregation

torch.set_num_threads(1)
D = torch.float64
TOL = {"rtol": 1e-6, "atol": 1e-6}


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=D)


def close(actual, expected) -> None:
    expected = torch.as_tensor(expected, dtype=D)
    torch.testing.assert_close(torch.as_tensor(actual, dtype=D), expected, **TOL)


REWARDS = t([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])


def test_grpo_by_hand():
    std = math.sqrt(4 * 0.25 / 3)  # sample std of (1, 0, 0, 1)
    a = 0.5 / (std + 1e-6)
    close(grpo(REWARDS), [[a, -a, -a, a], [0.0] * 4])  # all-equal group: 0, not NaN
    close(grpo(REWARDS, std_normalize=False), [[0.5, -0.5, -0.5, 0.5], [0.0] * 4])
    close(grpo(t([[3.0], [5.0]])), [[0.0], [0.0]])  # a group of one has no baseline signal


def test_dr_grpo_is_mean_centered_only():
    close(dr_grpo(t([[3.0, 1.0, 2.0]])), [[1.0, -1.0, 0.0]])


@pytest.mark.parametrize(
    ("rewards", "expected"),
    [
        ([[1.0, 0.0, 0.0, 1.0]], [[1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3]]),
        ([[3.0, 1.0, 2.0]], [[3 - 1.5, 1 - 2.5, 2 - 2.0]]),  # r_i - mean of the others
    ],
)
def test_rloo_leave_one_out(rewards, expected):
    close(rloo(t(rewards)), expected)


def test_rloo_needs_two():
    with pytest.raises(ValueError, match="2 completions"):
        rloo(t([[1.0], [0.0]]))


def test_reinforce_pp_whitens_over_the_batch():
    r = t([[1.0, 2.0], [3.0, 6.0]])  # batch mean 3
    std = math.sqrt((4 + 1 + 0 + 9) / 3)
    close(reinforce_pp(r), [[-2 / (std + 1e-6), -1 / (std + 1e-6)], [0.0, 3 / (std + 1e-6)]])
    # with the group baseline first: x = (-.5, .5, -1.5, 1.5), mean 0
    s = math.sqrt((0.25 + 0.25 + 2.25 + 2.25) / 3) + 1e-6
    close(reinforce_pp(r, group_baseline=True), [[-0.5 / s, 0.5 / s], [-1.5 / s, 1.5 / s]])


def test_gae_by_hand():
    gamma, lam = 0.9, 0.8
    rewards = t([[0.0, 0.0, 1.0, 0.0]])
    values = t([[0.5, 0.6, 0.7, 9.0]])  # position 3 is padding
    mask = torch.tensor([[True, True, True, False]])
    a2 = 1.0 - 0.7
    a1 = (0.9 * 0.7 - 0.6) + gamma * lam * a2
    a0 = (0.9 * 0.6 - 0.5) + gamma * lam * a1
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam)
    close(adv, [[a0, a1, a2, 0.0]])
    close(ret, [[a0 + 0.5, a1 + 0.6, a2 + 0.7, 0.0]])


def test_gae_skips_holes_in_the_mask():
    # the masked middle token (e.g. tool output) is skipped: its reward and value are ignored
    adv, _ = gae(t([[0.0, 5.0, 1.0]]), t([[0.5, 9.0, 0.7]]), torch.tensor([[1, 0, 1]]),
                 gamma=0.9, lam=0.8)  # fmt: skip
    close(adv, [[(0.9 * 0.7 - 0.5) + 0.72 * 0.3, 0.0, 0.3]])


def test_gae_gamma_lambda_one_is_return_minus_value():
    values = t([[0.2, 0.4, 0.1], [0.3, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    rewards = place_at_last_token(t([2.0, -1.0]), mask)
    adv, ret = gae(rewards, values, mask)
    close(adv, [[1.8, 1.6, 1.9], [-1.3, 0.0, 0.0]])
    close(ret, [[2.0, 2.0, 2.0], [-1.0, 0.0, 0.0]])
    white, _ = gae(rewards, values, mask, whiten=True)
    vals = [1.8, 1.6, 1.9, -1.3]
    mean = sum(vals) / 4
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / 3)  # sample std (n - 1), as verl
    w = [(v - mean) / (std + 1e-6) for v in vals]
    close(white, [[w[0], w[1], w[2]], [w[3], 0.0, 0.0]])


def test_value_loss_clipped_by_hand():
    values = t([[1.0, 2.0, 0.5]]).requires_grad_(True)
    old = t([[0.9, 1.0, 0.0]]).requires_grad_(True)
    returns = t([[1.5, 1.0, 0.5]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    # t0: inside the clip range: .5*.25;  t1: unclipped larger: .5*1;  t2: clipped larger:
    # V_clip = 0 + .2 = .2 -> .5*.09, no gradient
    out = value_loss(values, old, returns, mask, make_aggregation("token_mean", mask))
    close(out.loss, (0.125 + 0.5 + 0.045) / 3)
    out.loss.backward()
    close(values.grad, [[-0.5 / 3, 1.0 / 3, 0.0]])
    assert old.grad is None
    close(out.metrics["vf_clip_frac"], 1 / 3)
    plain = value_loss(values, old, returns, mask, make_aggregation("token_mean", mask),
                       clip_range=None)  # fmt: skip
    close(plain.loss, (0.125 + 0.5 + 0.0) / 3)


@pytest.mark.parametrize("clip_range", [0.2, None])
def test_value_loss_micro_batches_sum_to_full_batch(clip_range):
    """The critic loss with global (token_mean) denominators: micro-batches of rows give the
    same loss sum and gradient as the whole batch, as the policy losses do."""
    g = torch.Generator().manual_seed(3)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0]])
    values = torch.randn(5, 4, generator=g, dtype=D)
    old = values + 0.5 * torch.randn(5, 4, generator=g, dtype=D)
    returns = torch.randn(5, 4, generator=g, dtype=D)
    agg = make_aggregation("token_mean", mask)  # built once for the whole batch
    full_v = values.clone().requires_grad_(True)
    full = value_loss(full_v, old, returns, mask, agg, clip_range=clip_range)
    (full_grad,) = torch.autograd.grad(full.loss, full_v)
    total, grads = torch.zeros((), dtype=D), []
    for rows in (slice(0, 2), slice(2, 4), slice(4, 5)):
        v = values[rows].clone().requires_grad_(True)
        out = value_loss(v, old[rows], returns[rows], mask[rows], agg, clip_range=clip_range)
        total = total + out.loss.detach()
        grads.append(torch.autograd.grad(out.loss, v)[0])
    torch.testing.assert_close(total, full.loss.detach(), **TOL)
    torch.testing.assert_close(torch.cat(grads), full_grad, **TOL)


def test_all_equal_groups():
    r = t([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0], [0.5, 0.5, 0.5], [0.3, 0.3001, 0.3]])
    assert all_equal_groups(r).tolist() == [True, False, True, False]
    assert all_equal_groups(r, atol=1e-3).tolist() == [True, False, True, True]


def test_overlong_penalty_piecewise():
    lengths = torch.tensor([5, 6, 7, 8, 10, 12])
    close(overlong_penalty(lengths, max_len=10, cache_len=4), [0, 0, -0.25, -0.5, -1, -1])
    close(overlong_penalty(lengths, max_len=10, cache_len=4, penalty=0.5)[2], -0.125)
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(lengths, max_len=10, cache_len=0)


def test_reward_placement_and_broadcast():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    close(place_at_last_token(t([2.0, 3.0, 4.0]), mask), [[0, 2, 0], [0, 0, 3], [0, 0, 0]])
    close(to_token_level(t([[1.0, 2.0, 3.0]]), mask), [[1, 1, 0], [2, 2, 2], [0, 0, 0]])


def test_estimators_carry_no_gradient_and_registry():
    r = REWARDS.clone().requires_grad_(True)
    for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp"):
        assert not ADVANTAGE_ESTIMATORS[name](r).requires_grad
    assert set(ADVANTAGE_ESTIMATORS) == {"grpo", "dr_grpo", "rloo", "reinforce_pp", "gae"}
    with pytest.raises(ValueError, match=r"\[G, n\]"):
        grpo(t([1.0, 2.0]))
