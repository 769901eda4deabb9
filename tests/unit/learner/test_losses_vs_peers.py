"""Our losses, advantages and KL estimators against verl's and AReaL's own code.

The peers' functions are vendored verbatim in tests/peers/ (headers name repository, commit,
paths). Inputs are float64, seeded, with ragged masks (an empty row, holes inside rows) and
log-ratios spread over every clip region; values AND gradients (``torch.autograd.grad`` with
respect to the log-probs or the values) are compared. Where the implementations differ by a
convention, the test asserts the documented relation instead of equality: docs/algorithms.md,
"Conventions, and how they compare with verl and AReaL", names the test of each one.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from asyncrl.learner.algo.advantages import (
    dr_grpo,
    gae,
    grpo,
    reinforce_pp,
    rloo,
    to_token_level,
    value_loss,
)
from asyncrl.learner.algo.losses import (
    AGGREGATION_MODES,
    POLICY_LOSSES,
    LossInputs,
    LossParams,
    kl_penalty,
)
from asyncrl.learner.algo.losses import make_aggregation as make_agg
from tests.peers import areal_functional as areal
from tests.peers import verl_core_algos as verl

torch.set_num_threads(1)
D = torch.float64
EXACT = {"rtol": 1e-12, "atol": 1e-12}  # the same formula: float64 rounding only
F32 = {"rtol": 2e-6, "atol": 1e-6}  # AReaL computes these in float32 (.float())
# verl's masked_var multiplies by n / (n - 1) with n an int64 count: that division is float32
VERL_BESSEL = {"rtol": 1e-7, "atol": 1e-10}
VERL_MODE = {
    "token_mean": "token-mean",
    "seq_mean_token_sum": "seq-mean-token-sum",
    "seq_mean_token_mean": "seq-mean-token-mean",
    "seq_mean_token_sum_norm": "seq-mean-token-sum-norm",
}
NO_DUAL_CLIP_VERL = 1e12  # verl always applies its dual clip; a huge c never binds
B, T = 8, 9
LENGTHS = [9, 6, 1, 0, 7, 3, 9, 5]  # row 3 has no completion token


def close(actual, expected, tol=EXACT) -> None:
    torch.testing.assert_close(torch.as_tensor(actual, dtype=D), torch.as_tensor(expected, dtype=D),
                               **tol)  # fmt: skip


def ragged_mask(lengths, t_len=T) -> torch.Tensor:
    mask = torch.arange(t_len)[None, :] < torch.tensor(lengths)[:, None]
    for row, col in ((0, 3), (4, 1), (6, 7)):  # holes inside rows (tool output, say)
        if row < mask.shape[0] and col < t_len:
            mask[row, col] = False
    return mask


def batch(seed: int = 8) -> dict[str, torch.Tensor]:  # 8: >= 2 tokens in every clip region
    """pi_theta, pi_prox (log r ~ N(0, 1): every clip region), pi_behave (log rho ~ N(0, .7)
    plus a per-row offset, so tokens AND sequences fall outside [0.5, 2]), pi_ref, A, H."""
    g = torch.Generator().manual_seed(seed)
    randn = lambda scale, cols=T: torch.randn(B, cols, generator=g, dtype=D) * scale  # noqa: E731
    lp = torch.log(torch.rand(B, T, generator=g, dtype=D) * 0.9 + 0.05)
    prox = lp - randn(1.0)
    out = {
        "lp": lp,
        "prox": prox,
        "behave": prox - randn(0.7),
        "ref": lp + randn(1.5),
        "adv": randn(1.0),
        "ent": torch.rand(B, T, generator=g, dtype=D),
        "mask": ragged_mask(LENGTHS),
    }
    out["behave"] = out["behave"] - randn(0.8, cols=1)
    return out


def ours(name, b, mode, params, prox="prox", behave="behave", adv=None, **kw):
    """(LossOutput, d loss / d logprobs) of one of our policy losses on the whole batch."""
    lp = b["lp"].clone().requires_grad_(True)
    adv = b["adv"] if adv is None else adv
    prox_t = None if prox is None else b[prox]
    inputs = LossInputs(lp, prox_t, b[behave], adv, b["mask"], make_agg(mode, b["mask"]), **kw)
    out = POLICY_LOSSES[name](inputs, params)
    (grad,) = torch.autograd.grad(out.loss, lp)
    return out, grad


class VerlActorConfig(dict):
    """The fields compute_policy_loss_vanilla reads from verl's ActorConfig (a dict for .get)."""

    def __init__(self, clip_ratio_low, clip_ratio_high, clip_ratio_c, **global_batch_info):
        super().__init__(clip_ratio_c=clip_ratio_c)
        self.clip_ratio = self.clip_ratio_low = clip_ratio_low
        self.clip_ratio_high = clip_ratio_high
        self.global_batch_info = global_batch_info


def verl_ppo(b, mode, eps_low, eps_high, clip_c, **global_batch_info):
    lp = b["lp"].clone().requires_grad_(True)
    config = VerlActorConfig(eps_low, eps_high, clip_c, **global_batch_info)
    loss, metrics = verl.compute_policy_loss_vanilla(
        old_log_prob=b["prox"], log_prob=lp, advantages=b["adv"], response_mask=b["mask"],
        loss_agg_mode=VERL_MODE[mode], config=config,
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, lp)
    return loss, grad, metrics


def to_verl_convention(value, grad, mode, mask):
    """Our (loss, gradient) in verl's convention for ``mode``: its seq-mean-token-sum-norm has
    no 1/N_seq. (verl's seq-mean-token-mean and masked_mean add 1e-8 to an integer count,
    which promotes to float32, where the 1e-8 vanishes: the same L_i as ours.)"""
    if mode == "seq_mean_token_sum_norm":
        n_seq = float(mask.any(-1).sum())
        return value * n_seq, grad * n_seq
    return value, grad


def clip_regions(b, eps_low, eps_high, c) -> dict[str, int]:
    r, a, m = (b["lp"] - b["prox"]).exp(), b["adv"], b["mask"]
    return {
        "high": int((m & (a > 0) & (r > 1 + eps_high)).sum()),
        "low": int((m & (a < 0) & (r < 1 - eps_low)).sum()),
        "dual": int((m & (a < 0) & (r > c)).sum()),
        "inside": int((m & (r > 1 - eps_low) & (r < 1 + eps_high)).sum()),
    }


# ------------------------------------------------------------- PPO clipped loss vs verl


def test_the_random_batch_reaches_every_clip_region():
    regions = clip_regions(batch(), 0.2, 0.28, 3.0)
    assert min(regions.values()) >= 2, regions  # else the comparisons below prove little


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
@pytest.mark.parametrize("clip_c", [3.0, None])
def test_ppo_loss_matches_verl(mode, clip_c):
    """decoupled_ppo with pi_prox = pi_behave (w = 1) is verl's compute_policy_loss_vanilla."""
    b = batch()
    params = LossParams(eps_low=0.2, eps_high=0.28, clip_c=clip_c)
    out, grad = ours("decoupled_ppo", b, mode, params, behave="prox")
    # bypass_ppo (pi_prox := pi_behave, no recompute) is the same loss
    out_bypass, grad_bypass = ours("bypass_ppo", b, mode, params, prox=None, behave="prox")
    close(out_bypass.loss, out.loss)
    close(grad_bypass, grad)
    verl_c = NO_DUAL_CLIP_VERL if clip_c is None else clip_c
    v_loss, v_grad, v_metrics = verl_ppo(b, mode, 0.2, 0.28, verl_c)
    value, grad = to_verl_convention(out.loss, grad, mode, b["mask"])
    close(value, v_loss)
    close(grad, v_grad)
    assert grad.abs().sum() > 0 and torch.all(grad[~b["mask"]] == 0)
    m = out.metrics
    # verl's clip fractions are means of .float() tensors: float32
    close(m["clip_frac_low"] + m["clip_frac_high"], v_metrics["actor/pg_clipfrac"], F32)
    close(m["clip_frac_dual"], v_metrics["actor/pg_clipfrac_lower"], F32)


def test_the_dual_clip_changes_the_verl_comparison():
    """Guard against a vacuous comparison: with and without the dual clip the gradients differ
    on the tokens with A < 0 and r > 3 (zero with it, -A r / N without), on both sides alike."""
    b = batch()
    _, with_dual = ours("decoupled_ppo", b, "token_mean", LossParams(clip_c=3.0), behave="prox")
    _, without = ours("decoupled_ppo", b, "token_mean", LossParams(clip_c=None), behave="prox")
    _, v_with, _ = verl_ppo(b, "token_mean", 0.2, 0.2, 3.0)
    _, v_without, _ = verl_ppo(b, "token_mean", 0.2, 0.2, NO_DUAL_CLIP_VERL)
    r = (b["lp"] - b["prox"]).exp()
    dual = b["mask"] & (b["adv"] < 0) & (r > 3.0)
    for w, wo in ((with_dual, without), (v_with, v_without)):
        assert torch.all(w[dual] == 0) and torch.all(wo[dual] != 0)
        close(w[~dual], wo[~dual])
    close(without[dual], -(b["adv"] * r)[dual] / b["mask"].sum())


def test_verl_global_batch_size_counts_empty_rows():
    """verl's trainer passes global_batch_size = the mini-batch's rows, empty ones included;
    ours counts the sequences with a masked token (verl's own default when it is None)."""
    b = batch()
    out, grad = ours("decoupled_ppo", b, "seq_mean_token_sum", LossParams(), behave="prox")
    v_loss, v_grad, _ = verl_ppo(b, "seq_mean_token_sum", 0.2, 0.2, 3.0, global_batch_size=B)
    n_seq = float(b["mask"].any(-1).sum())
    assert n_seq == B - 1
    close(out.loss * n_seq / B, v_loss)
    close(grad * n_seq / B, v_grad)
    # token-mean with verl's global token count (and dp_size 1) is ours exactly
    out, grad = ours("decoupled_ppo", b, "token_mean", LossParams(), behave="prox")
    n_tok = int(b["mask"].sum())
    v_loss, v_grad, _ = verl_ppo(b, "token_mean", 0.2, 0.2, 3.0, batch_num_tokens=n_tok)
    close(out.loss, v_loss)
    close(grad, v_grad)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean"])
def test_kl_and_entropy_terms_match_verl_actor(estimator, mode):
    """verl's dp_actor: pg_loss - entropy_coeff * agg(H) + kl_loss_coef * agg(kl_penalty)."""
    b = batch()
    params = LossParams(kl_coef=0.1, kl_estimator=estimator, entropy_coef=0.01)
    out, grad = ours("decoupled_ppo", b, mode, params, behave="prox", ref_logprobs=b["ref"],
                     entropy=b["ent"])  # fmt: skip
    lp = b["lp"].clone().requires_grad_(True)
    config = VerlActorConfig(0.2, 0.2, 3.0)
    pg, _ = verl.compute_policy_loss_vanilla(b["prox"], lp, b["adv"], b["mask"], VERL_MODE[mode],
                                             config)  # fmt: skip
    kld = verl.kl_penalty(logprob=lp, ref_logprob=b["ref"], kl_penalty=estimator)
    entropy = verl.agg_loss(loss_mat=b["ent"], loss_mask=b["mask"], loss_agg_mode=VERL_MODE[mode])
    kl = verl.agg_loss(loss_mat=kld, loss_mask=b["mask"], loss_agg_mode=VERL_MODE[mode])
    v_loss = pg - entropy * 0.01 + kl * 0.1
    (v_grad,) = torch.autograd.grad(v_loss, lp)
    value, grad = to_verl_convention(out.loss, grad, mode, b["mask"])
    close(value, v_loss)
    close(grad, v_grad)


# ------------------------------------------------------------------------ KL estimators

# x = log pi_ref - log pi_theta: small values, then -25, +25 (beyond the old +-20 clamp), then
# values where k3 > 10 (verl and ours clamp it there)
KL_X = torch.tensor([[-0.3, 0.01, 0.7, -1.5, 2.0, -25.0, 25.0, 3.0, -12.0]], dtype=D)
KL_LP = torch.log(torch.linspace(0.1, 0.9, KL_X.shape[1], dtype=D))[None]


@pytest.mark.parametrize(("ours_name", "verl_name"),
                         [("k1", "k1"), ("k1", "kl"), ("k2", "k2"), ("k2", "mse"),
                          ("k3", "k3"), ("k3", "low_var_kl")])  # fmt: skip
def test_kl_estimators_match_verl(ours_name, verl_name):
    lp = KL_LP.clone().requires_grad_(True)
    mine = kl_penalty(lp, KL_LP + KL_X, ours_name)
    (grad,) = torch.autograd.grad(mine.sum(), lp)
    lp2 = KL_LP.clone().requires_grad_(True)
    theirs = verl.kl_penalty(lp2, KL_LP + KL_X, verl_name)
    (v_grad,) = torch.autograd.grad(theirs.sum(), lp2)
    close(mine, theirs)
    close(grad, v_grad)


def test_k1_k2_keep_their_gradient_beyond_20_nats_and_k3_is_clamped_as_verl():
    """Decision: no clamp on k1/k2, so the tokens that drifted furthest still get
    the full gradient; k3 keeps verl's clamps (x at +-20 before exp, the value at 10)."""
    lp = KL_LP.clone().requires_grad_(True)
    x = KL_X[0]
    grads = {}
    for name in ("k1", "k2", "k3"):
        (grads[name],) = torch.autograd.grad(kl_penalty(lp, KL_LP + KL_X, name).sum(), lp)
    far = x.abs() > 20
    close(grads["k1"][0], torch.ones_like(x))  # d(-x)/d log pi_theta = 1 for every token
    close(grads["k2"][0], -x)  # d(x^2/2)/d log pi_theta = -x: 25 and -25 at |x| = 25
    close(grads["k2"][0][far].abs(), [25.0, 25.0])
    k3 = kl_penalty(KL_LP, KL_LP + KL_X, "k3")[0]
    big = (torch.exp(x) - 1 - x) > 10
    assert big.sum() == 4  # x = -25, 25, 3, -12
    close(k3[big], torch.full_like(k3[big], 10.0))
    assert torch.all(grads["k3"][0][big] == 0)
    close(grads["k3"][0][~big], 1 - torch.exp(x[~big]))  # d k3 / d log pi_theta


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_areal_kl_estimator_is_ours_clamped_at_10_in_float32(name):
    """AReaL's KLEstimator (apply_clamp=True, its default) clamps every estimator's value to
    [-10, 10] and computes in float32; its log_probs - log_probs_base has our k1 sign."""
    mine = kl_penalty(KL_LP, KL_LP + KL_X, name)
    theirs = areal.KLEstimator(name)(KL_LP, KL_LP + KL_X)
    assert theirs.dtype == torch.float32
    close(theirs, mine.clamp(-10, 10), F32)
    if name != "k3":  # ours is not clamped: the two differ exactly where |estimate| > 10
        assert torch.any(mine.abs() > 10)


# ------------------------------------------------------------------ advantages vs verl


def outcome_batch(groups: int, n: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (groups, n), generator=g).to(D) + torch.rand(groups, n,
                                                                               generator=g, dtype=D)  # fmt: skip
    rewards[0] = 0.5  # an all-equal group: advantage 0 on both sides
    lengths = torch.randint(1, T + 1, (groups * n,), generator=g).tolist()
    mask = ragged_mask(lengths)
    last = T - 1 - mask.flip(-1).to(torch.int8).argmax(-1)
    token_rewards = torch.zeros(groups * n, T, dtype=D)
    token_rewards[torch.arange(groups * n), last] = rewards.reshape(-1)
    index = np.repeat(np.arange(groups), n)
    return rewards, mask, token_rewards, index


@pytest.mark.parametrize("std_normalize", [True, False])
def test_grpo_advantages_match_verl(std_normalize):
    rewards, mask, token_rewards, index = outcome_batch(5, 4)
    mine = to_token_level(grpo(rewards, std_normalize=std_normalize), mask)
    theirs, _ = verl.compute_grpo_outcome_advantage(token_rewards, mask.long(), index,
                                                     norm_adv_by_std_in_grpo=std_normalize)  # fmt: skip
    close(mine, theirs)
    assert torch.all(mine[:4] == 0) and mine.abs().sum() > 0  # group 0 is all-equal
    if not std_normalize:
        close(to_token_level(dr_grpo(rewards), mask), theirs)


def test_grpo_group_of_one_is_zero_for_us_and_areal_but_r_for_verl():
    rewards, mask, token_rewards, index = outcome_batch(6, 1)
    mine = grpo(rewards)
    close(mine, torch.zeros_like(mine))
    theirs, _ = verl.compute_grpo_outcome_advantage(token_rewards, mask.long(), index)
    std = torch.tensor(1.0)  # verl: mean 0 and std 1, as float32 tensors (so is 1 + 1e-6)
    close(theirs, to_token_level(rewards / (std + 1e-6), mask))
    config = areal.NormConfig(mean_level="group", std_level="group", group_size=1, eps=1e-6)
    close(areal.Normalization(config)(rewards.reshape(-1)), mine.reshape(-1), F32)


@pytest.mark.parametrize("std_normalize", [True, False])
def test_grpo_matches_areal_group_normalization(std_normalize):
    rewards, *_ = outcome_batch(5, 4)
    config = areal.NormConfig(mean_level="group", std_level="group" if std_normalize else None,
                              std_unbiased=True, eps=1e-6, group_size=4)  # fmt: skip
    theirs = areal.Normalization(config)(rewards.reshape(-1))
    close(theirs, grpo(rewards, std_normalize=std_normalize).reshape(-1), F32)


def test_rloo_matches_verl():
    rewards, mask, token_rewards, index = outcome_batch(5, 4)
    theirs, _ = verl.compute_rloo_outcome_advantage(token_rewards, mask.long(), index)
    close(to_token_level(rloo(rewards), mask), theirs)


def test_reinforce_pp_baseline_relation_to_verl():
    """verl whitens the group-centred rewards over TOKENS (each sequence weighs its length) with
    rsqrt(var + 1e-8); ours over the G*n sequences with /(std + 1e-6), both sample variances.
    With equal lengths L the token statistics are the sequence ones, the variance differing by
    the Bessel factors: var_tok = var_seq * (N - 1)/N * N L/(N L - 1)."""
    rewards, _, _, index = outcome_batch(5, 4)
    n_rows, length = rewards.numel(), T
    mask = torch.ones(n_rows, length, dtype=torch.bool)
    token_rewards = torch.zeros(n_rows, length, dtype=D)
    token_rewards[:, -1] = rewards.reshape(-1)
    theirs, _ = verl.compute_reinforce_plus_plus_baseline_outcome_advantage(token_rewards,
                                                                             mask.long(), index)  # fmt: skip
    mine = reinforce_pp(rewards, group_baseline=True)
    centred = rewards - rewards.mean(-1, keepdim=True)
    var_seq = centred.reshape(-1).var()
    var_tok = var_seq * (n_rows - 1) / n_rows * (n_rows * length) / (n_rows * length - 1)
    expected = mine * (var_seq.sqrt() + 1e-6) / (var_tok + 1e-8).sqrt()
    close(theirs, to_token_level(expected, mask), VERL_BESSEL)
    assert not torch.allclose(theirs, to_token_level(mine, mask), rtol=1e-3)  # it matters


# ------------------------------------------------------------------------- GAE vs verl


def gae_batch(seed: int = 2):
    g = torch.Generator().manual_seed(seed)
    mask = ragged_mask([9, 6, 2, 7, 3, 9, 5, 8])
    rewards = torch.randn(B, T, generator=g, dtype=D) * 0.1  # per-token (KL-like) rewards,
    values = torch.randn(B, T, generator=g, dtype=D)  # and garbage outside the mask
    return mask, rewards, values


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_matches_verl(gamma, lam):
    """Returns equal verl's; raw advantages equal verl's returns - values (verl always whitens);
    whitened: ours = (A - mean)/(std + 1e-6) with the SAMPLE std (our decision),
    verl = (A - mean) * rsqrt(var + 1e-8) with the sample var (convention: eps placement)."""
    mask, rewards, values = gae_batch()
    m, mi = mask, mask.long()  # verl's response_mask: int64 (a slice of the attention mask)
    raw, returns = gae(rewards, values, mask, gamma=gamma, lam=lam)
    white, returns_w = gae(rewards, values, mask, gamma=gamma, lam=lam, whiten=True)
    theirs, v_returns = verl.compute_gae_advantage_return(rewards, values, mi, gamma, lam)
    close(returns[m], v_returns[m])
    close(returns_w, returns)
    close(raw[m], (v_returns - values)[m])
    assert torch.all(raw[~m] == 0) and torch.all(white[~m] == 0) and torch.all(returns[~m] == 0)

    a = raw[m]
    close(white[m] * (a.std() + 1e-6), a - a.mean())  # ours: sample std, eps added to the std
    var = verl.masked_var(raw, mi)  # verl's own sample variance
    close(var, a.var(), VERL_BESSEL)
    close(theirs[m] * (var + 1e-8).sqrt(), a - a.mean())
    close(white[m], theirs[m], {"rtol": 1e-5, "atol": 1e-6})  # eps placement: < 1e-6 / std
    population = (a - a.mean()) / ((a - a.mean()).pow(2).mean().sqrt() + 1e-6)
    assert not torch.allclose(white[m], population, rtol=1e-3)  # n-1 vs n is visible here


def test_gae_whitening_matches_areal_normalization():
    """AReaL's Normalization (batch mean and std over the masked tokens, std_unbiased=True,
    its default) and masked_normalization(unbiased=True) are ours to float32, with eps 1e-6."""
    mask, rewards, values = gae_batch()
    raw, _ = gae(rewards, values, mask, gamma=0.99, lam=0.95)
    white, _ = gae(rewards, values, mask, gamma=0.99, lam=0.95, whiten=True)
    config = areal.NormConfig(mean_level="batch", std_level="batch", std_unbiased=True, eps=1e-6)
    close(areal.Normalization(config)(raw, mask), white, F32)
    theirs = areal.masked_normalization(raw, mask, unbiased=True, eps=1e-6, all_reduce=False)
    close(theirs[mask], white[mask], F32)
    default = areal.masked_normalization(raw, mask, eps=1e-6, all_reduce=False)  # population
    assert not torch.allclose(default[mask].to(D), white[mask], rtol=1e-3)


@pytest.mark.parametrize("lengths", [[0] * B, [1] + [0] * (B - 1)])
def test_gae_whitening_with_fewer_than_two_tokens_is_zero(lengths):
    """Our rule: fewer than 2 masked tokens -> whitened advantages 0 (centred, nothing to
    scale), no error; verl's masked_var raises ValueError there."""
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    _, rewards, values = gae_batch()
    white, returns = gae(rewards, values, mask, whiten=True)
    assert torch.all(white == 0) and torch.isfinite(returns).all()
    raw, _ = gae(rewards, values, mask)
    assert raw.abs().sum() > 0 or sum(lengths) == 0
    with pytest.raises(ValueError):
        verl.compute_gae_advantage_return(rewards, values, mask.long(), 1.0, 1.0)


# -------------------------------------------------------------------- value loss vs verl


def value_batch(seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(B, T, generator=g, dtype=D)
    values = old + torch.randn(B, T, generator=g, dtype=D) * 0.3  # ~half outside +-0.2
    returns = old + torch.randn(B, T, generator=g, dtype=D)
    return values, old, returns, ragged_mask(LENGTHS)


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
@pytest.mark.parametrize("clip_range", [0.2, None])
def test_value_loss_matches_verl(mode, clip_range):
    values, old, returns, mask = value_batch()
    v = values.clone().requires_grad_(True)
    out = value_loss(v, old, returns, mask, make_agg(mode, mask), clip_range=clip_range)
    (grad,) = torch.autograd.grad(out.loss, v)
    v2 = values.clone().requires_grad_(True)
    verl_clip = 1e9 if clip_range is None else clip_range  # verl always clips
    v_loss, v_frac = verl.compute_value_loss(v2, returns, old, mask, verl_clip, VERL_MODE[mode])
    (v_grad,) = torch.autograd.grad(v_loss, v2)
    value, grad = to_verl_convention(out.loss, grad, mode, mask)
    close(value, v_loss)
    close(grad, v_grad)
    close(out.metrics["vf_clip_frac"], v_frac, F32)  # verl: mean of a .float() tensor
    assert (0 < out.metrics["vf_clip_frac"] < 0.5) == (clip_range is not None)


def test_value_loss_matches_areal_critic_loss():
    """AReaL's ppo_critic_loss_fn (float32 only, token mean over the mask)."""
    values, old, returns, mask = value_batch()
    v = values.clone().requires_grad_(True)
    out = value_loss(v, old, returns, mask, make_agg("token_mean", mask), clip_range=0.2)
    (grad,) = torch.autograd.grad(out.loss, v)
    v32 = values.float().requires_grad_(True)
    a_loss, stat = areal.ppo_critic_loss_fn(v32, old.float(), returns.float(), 0.2, mask)
    (a_grad,) = torch.autograd.grad(a_loss, v32)
    close(out.loss, a_loss, F32)
    close(grad, a_grad, F32)
    close(out.metrics["vf_clip_frac"], stat["clip_mask"].sum() / mask.sum(), F32)


def test_vf_clip_frac_counts_no_token_inside_the_clip_range():
    """With every |V - V_old| < clip_range nothing is clipped: the clipped term must tie the
    unclipped one exactly (V_old + clamp(V - V_old) differed from V by rounding and counted
    about 0.1% of such tokens as clipped; fixed with verl's clamp of V itself)."""
    g = torch.Generator().manual_seed(4)
    values = torch.randn(64, 256, generator=g, dtype=D)
    old = values + (torch.rand(64, 256, generator=g, dtype=D) - 0.5) * 0.3  # |dV| < .15 < .2
    returns = torch.randn(64, 256, generator=g, dtype=D)
    mask = torch.ones(64, 256, dtype=torch.bool)
    v = values.clone().requires_grad_(True)
    out = value_loss(v, old, returns, mask, make_agg("token_mean", mask), clip_range=0.2)
    assert out.metrics["vf_clip_frac"] == 0.0
    (grad,) = torch.autograd.grad(out.loss, v)
    close(grad, (values - returns) / mask.sum())  # the plain MSE gradient everywhere


# ------------------------------------------------------------ decoupled PPO vs AReaL


def areal_ppo(b, *, c_clip, rejection_sampling, level="token", adv=None):
    lp = b["lp"].clone().requires_grad_(True)
    loss, stat = areal.ppo_actor_loss_fn(
        logprobs=lp, proximal_logprobs=b["prox"], old_logprobs=b["behave"],
        advantages=b["adv"] if adv is None else adv, eps_clip=0.2, loss_mask=b["mask"],
        eps_clip_higher=0.28, c_clip=c_clip, rejection_sampling=rejection_sampling,
        importance_sampling_level=level,
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, lp)
    return loss, grad, stat


def rho_spread(b) -> tuple[int, int, int, int]:
    """Tokens with rho > 2 and < 0.5, sequences whose geometric-mean rho is > 2 and < 0.5."""
    m = b["mask"]
    log_rho = torch.where(m, b["prox"] - b["behave"], 0)
    seq = log_rho.sum(-1)[m.any(-1)] / m.sum(-1)[m.any(-1)]
    tok = log_rho[m]
    two = math.log(2)
    return tuple(int(n) for n in ((tok > two).sum(), (tok < -two).sum(), (seq > two).sum(),
                                  (seq < -two).sum()))  # fmt: skip


def test_the_random_batch_has_weights_outside_both_bounds():
    assert min(rho_spread(batch())) >= 1, rho_spread(batch())


@pytest.mark.parametrize("clip_c", [3.0, None])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_decoupled_ppo_matches_areal_truncated_weight(clip_c, level):
    """AReaL's cap on pi_prox/pi_behave (RejectionSamplingConfig action=clamp, the old
    behav_imp_weight_cap) is our is_cap: decoupled_ppo, token_mean."""
    b = batch()
    rs = areal.RejectionSamplingConfig(level=level, action="clamp", metric="ratio", upper=2.0)
    a_loss, a_grad, _ = areal_ppo(b, c_clip=clip_c, rejection_sampling=rs)
    params = LossParams(eps_low=0.2, eps_high=0.28, clip_c=clip_c, is_cap=2.0, is_level=level)
    out, grad = ours("decoupled_ppo", b, "token_mean", params)
    close(out.loss, a_loss, F32)  # AReaL's weight exp(prox - behave) is computed in float32
    close(grad, a_grad, F32)
    assert grad.abs().sum() > 0


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_masked_is_matches_areal_rejection_mask(level):
    """AReaL's action=mask drops the units outside [lower, upper] and keeps the original token
    count as the denominator: our masked_is (is_objective=ppo)."""
    b = batch()
    rs = areal.RejectionSamplingConfig(level=level, action="mask", metric="ratio", lower=0.5,
                                       upper=2.0)  # fmt: skip
    a_loss, a_grad, stat = areal_ppo(b, c_clip=3.0, rejection_sampling=rs)
    params = LossParams(eps_high=0.28, is_level=level, mask_low=0.5, mask_high=2.0)
    out, grad = ours("masked_is", b, "token_mean", params)
    close(out.loss, a_loss, F32)
    close(grad, a_grad, F32)
    dropped = b["mask"] & ~stat["behave_mask"]
    assert dropped.any() and torch.all(grad[dropped] == 0)


def test_areal_without_rejection_sampling_drops_the_behaviour_weight():
    """AReaL's default (rejection_sampling=None) clips around pi_prox but applies no weight
    pi_prox/pi_behave: our decoupled_ppo with pi_behave := pi_prox. Ours always weights."""
    b = batch()
    a_loss, a_grad, _ = areal_ppo(b, c_clip=None, rejection_sampling=None)
    params = LossParams(eps_high=0.28, clip_c=None)
    out, grad = ours("decoupled_ppo", b, "token_mean", params, behave="prox")
    close(out.loss, a_loss)
    close(grad, a_grad)
    weighted, _ = ours("decoupled_ppo", b, "token_mean", params)
    assert not torch.isclose(weighted.loss, a_loss, rtol=1e-3)


@pytest.mark.parametrize("clip_c", [3.0, None])
def test_gspo_matches_areal_sequence_level_ratio(clip_c):
    """AReaL's importance_sampling_level=sequence (the gradient flows through the sequence
    mean of log r) equals our GSPO-token loss (sg(s_i) * pi/sg(pi)) when A is constant per
    sequence, token_mean, no behaviour weight."""
    b = batch()
    adv = to_token_level(torch.randn(B, generator=torch.Generator().manual_seed(5), dtype=D),
                         b["mask"])  # fmt: skip
    a_loss, a_grad, _ = areal_ppo(b, c_clip=clip_c, rejection_sampling=None, level="sequence",
                                  adv=adv)  # fmt: skip
    params = LossParams(eps_low=0.2, eps_high=0.28, clip_c=clip_c)
    out, grad = ours("gspo", b, "token_mean", params, behave="prox", adv=adv)
    close(out.loss, a_loss)
    close(grad, a_grad)
    clipped = out.metrics["clip_frac_low"] + out.metrics["clip_frac_high"]
    assert 0 < clipped < 1  # some sequences clipped, some learning


# ------------------------------------------------------------------ default dual clip


def test_default_dual_clip_is_verls_and_bounds_stale_negative_tokens():
    """Decision: clip_c defaults to 3 (verl's). A token with A < 0 whose ratio ran to
    10 adds at most -3 A and no gradient; clip_c=None (config null) restores -10 A."""
    from asyncrl.core.config.job import AlgorithmConfig
    from asyncrl.core.config.load import load_config

    assert LossParams().clip_c == 3.0 == AlgorithmConfig().clip_c
    assert load_config(["algorithm.clip_c=null"]).algorithm.clip_c is None
    presets_off = {p: load_config([f"algorithm={p}"]).algorithm.clip_c for p in ("gspo", "dapo")}
    assert presets_off == {"gspo": None, "dapo": None}
    assert load_config(["algorithm=ppo"]).algorithm.clip_c == 3.0
    b = {
        "lp": torch.log(torch.tensor([[0.5, 0.5]], dtype=D)),
        "prox": torch.log(torch.tensor([[0.05, 0.5]], dtype=D)),  # r = 10, 1
        "adv": torch.tensor([[-2.0, -1.0]], dtype=D),
        "mask": torch.ones(1, 2, dtype=torch.bool),
    }
    out, grad = ours("decoupled_ppo", b, "token_mean", LossParams(), behave="prox")
    close(out.loss, (3.0 * 2.0 + 1.0) / 2)
    close(grad, [[0.0, 0.5]])
    assert out.metrics["clip_frac_dual"] == 0.5
    off, off_grad = ours("decoupled_ppo", b, "token_mean", LossParams(clip_c=None), behave="prox")
    close(off.loss, (10.0 * 2.0 + 1.0) / 2)
    close(off_grad, [[10.0, 0.5]])
    assert math.isclose(off.metrics["loss"] / out.metrics["loss"], 21 / 7)
