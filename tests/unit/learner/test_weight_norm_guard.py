"""The weight-norm jump guard (``learner.lr=1e30`` trained until the weights were
1e29 and the failure pointed at a checkpoint of them)."""

from __future__ import annotations

import pytest
import torch

from asyncrl.learner.compute.finite import WeightNormGuard, weight_norm


def test_weight_norm_is_the_l2_norm_of_every_parameter():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    want = torch.cat([p.detach().double().flatten() for p in model.parameters()]).norm().item()
    assert weight_norm(model) == pytest.approx(want, rel=1e-6)


def test_a_jump_beyond_the_limit_fails_naming_lr_and_small_moves_pass():
    guard = WeightNormGuard(2.0)
    guard.last = 10.0
    assert guard.check(0, 10.1) is None and guard.check(1, 19.0) is None
    problem = guard.check(2, 1e29)
    assert problem.startswith("step 2 multiplied the policy weights' norm by 5.26e+27")
    assert "learner.max_weight_norm_jump=2" in problem and "lower learner.lr" in problem
    assert guard.check(3, float("inf")) is None  # the non-finite guard reports that one


def test_zero_turns_it_off_and_one_or_less_is_refused():
    off = WeightNormGuard(0)
    off.last = 1.0
    assert off.check(0, 1e30) is None
    with pytest.raises(ValueError, match="0 \\(off\\) or > 1"):
        WeightNormGuard(1.0)
