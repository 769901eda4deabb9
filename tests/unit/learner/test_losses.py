"""Policy losses and aggregation against values computed by hand (float64, tol 1e-6)."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.learner.algo.aggregation import masked_mean, merge_metrics, weight_stats
from asyncrl.learner.algo.losses import (
    AGGREGATION_MODES,
    POLICY_LOSSES,
    Aggregation,
    LossInputs,
    LossParams,
    aggregate,
    kl_penalty,
    make_aggregation,
)

torch.set_num_threads(1)
D = torch.float64
TOL = {"rtol": 1e-6, "atol": 1e-6}
PG_FORMS = [("tis", "pg"), ("masked_is", "pg")]
PPO_FORMS = [(k, "ppo") for k in ("decoupled_ppo", "bypass_ppo", "tis", "masked_is", "gspo")]


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=D)


def logp(probs) -> torch.Tensor:
    return torch.log(t(probs))


def close(actual, expected) -> None:
    expected = torch.as_tensor(expected, dtype=D)
    torch.testing.assert_close(torch.as_tensor(actual, dtype=D), expected, **TOL)


def run(name, lp, prox, behave, adv, mask, agg=None, params=None, **kw):
    """Call a loss with a leaf ``lp``; returns (LossOutput, grad wrt lp)."""
    lp = lp.clone().requires_grad_(True)
    agg = agg or make_aggregation("token_mean", mask)
    inputs = LossInputs(lp, prox, behave, adv, mask, agg, **kw)
    out = POLICY_LOSSES[name](inputs, params or LossParams())
    (grad,) = torch.autograd.grad(out.loss, lp)
    return out, grad


# ---------------------------------------------------------------- aggregation

AGG_V = t([[1, 2, 3, 100], [4, 5, 100, 100], [100, 100, 100, 100]])
AGG_M = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    ("mode", "max_len", "expected"),
    [
        ("token_mean", None, (1 + 2 + 3 + 4 + 5) / 5),
        ("seq_mean_token_sum", None, (6 + 9) / 2),  # the empty row 2 is not a sequence
        ("seq_mean_token_mean", None, (6 / 3 + 9 / 2) / 2),
        ("seq_mean_token_sum_norm", None, (6 + 9) / (2 * 4)),  # max_len defaults to T = 4
        ("seq_mean_token_sum_norm", 10, (6 + 9) / (2 * 10)),
    ],
)
def test_aggregate_modes_by_hand(mode, max_len, expected):
    agg = make_aggregation(mode, AGG_M, max_len)
    assert (agg.num_tokens, agg.num_seqs) == (5.0, 2.0)
    close(aggregate(AGG_V, AGG_M.float(), agg), expected)  # float mask works like bool


def test_aggregate_all_masked_is_zero_not_nan():
    m = torch.zeros(2, 3)
    for mode in AGGREGATION_MODES:
        close(aggregate(torch.full((2, 3), math.nan, dtype=D), m, make_aggregation(mode, m)), 0.0)


def test_aggregation_rejects_bad_mode_and_denominators():
    with pytest.raises(ValueError, match="aggregation mode"):
        make_aggregation("sum", AGG_M)
    with pytest.raises(ValueError, match="denominators"):
        Aggregation("token_mean", num_tokens=-1.0, num_seqs=1.0, max_len=4.0)


# ------------------------------------------------- micro-batching, every loss x mode


def _random_batch(seed=0, b=5, t_len=6):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 3, 0, 5, 1])  # row 2 has no completion token
    mask = torch.arange(t_len)[None, :] < lengths[:, None]
    mask[0, 0] = False  # a prompt-like hole inside a row
    probs = lambda: torch.rand(b, t_len, generator=g, dtype=D) * 0.8 + 0.1  # noqa: E731
    lp, prox, behave = probs().log(), probs().log(), probs().log()
    adv = torch.randn(b, t_len, generator=g, dtype=D)
    ref, ent = probs().log(), torch.rand(b, t_len, generator=g, dtype=D)
    return lp, prox, behave, adv, mask, ref, ent


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_micro_batches_sum_to_full_batch(name, mode, level):
    lp, prox, behave, adv, mask, ref, ent = _random_batch()
    params = LossParams(clip_c=3.0, is_level=level, kl_coef=0.1, entropy_coef=0.01)
    agg = make_aggregation(mode, mask)  # global denominators, built once for the step
    full_lp = lp.clone().requires_grad_(True)
    extra = {"ref_logprobs": ref, "entropy": ent}
    full = POLICY_LOSSES[name](LossInputs(full_lp, prox, behave, adv, mask, agg, **extra), params)
    (full_grad,) = torch.autograd.grad(full.loss, full_lp)

    total, grads = torch.zeros((), dtype=D), []
    for rows in (slice(0, 2), slice(2, 3), slice(3, 5)):
        used = mask[rows].any(0).nonzero()
        cols = slice(0, int(used.max()) + 1 if used.numel() else 1)  # own padding width only
        part = lambda x, r=rows, c=cols: x[r, c]  # noqa: E731
        mb_lp = part(lp).clone().requires_grad_(True)
        inputs = LossInputs(
            mb_lp, part(prox), part(behave), part(adv), part(mask), agg,
            ref_logprobs=part(ref), entropy=part(ent),
        )  # fmt: skip
        out = POLICY_LOSSES[name](inputs, params)
        (g,) = torch.autograd.grad(out.loss, mb_lp)
        total = total + out.loss.detach()
        grads.append(torch.nn.functional.pad(g, (0, 6 - g.shape[1])))
    torch.testing.assert_close(total, full.loss.detach(), **TOL)
    torch.testing.assert_close(torch.cat(grads), full_grad, **TOL)


# ------------------------------------------------------------- decoupled PPO

# B=2, T=3; row 1 position 2 is padding. Token by token (eps 0.2, is_cap 2):
#  (0,0) rho=.4/.2=2 (not > cap), r=.5/.4=1.25 > 1.2, A=+1  -> clipped high: 2 * -1.2
#  (0,1) rho=1, r=1, A=-1                                   -> 1, d/dlp = -w*A*r = 1
#  (0,2) rho=1, r=.15/.25=.6 < .8, A=-2                     -> clipped low: -(-2)*.8 = 1.6
#  (1,0) rho=1, r=.55/.5=1.1, A=.5                          -> -.55, d/dlp = -.55
#  (1,1) rho=.2/.05=4 -> 2, r=.1/.2=.5 < .8, A=-.5          -> clipped low: 2 * .4
LP = logp([[0.5, 0.3, 0.15], [0.55, 0.1, 0.3]])
PROX = logp([[0.4, 0.3, 0.25], [0.5, 0.2, 0.3]])
BEHAVE = logp([[0.2, 0.3, 0.25], [0.5, 0.05, 0.3]])
ADV = t([[1.0, -1.0, -2.0], [0.5, -0.5, 0.0]])
MASK = torch.tensor([[True, True, True], [True, True, False]])


def test_decoupled_ppo_by_hand():
    out, grad = run("decoupled_ppo", LP, PROX, BEHAVE, ADV, MASK)
    close(out.loss, (-2.4 + 1.0 + 1.6 - 0.55 + 0.8) / 5)
    close(grad, [[0.0, 1 / 5, 0.0], [-0.55 / 5, 0.0, 0.0]])  # none through clipped tokens
    rho = [2.0, 1.0, 1.0, 1.0, 4.0]  # raw, before truncation
    m = out.metrics
    close(m["is_weight_mean"], sum(rho) / 5)
    close(m["is_weight_max"], 4.0)
    close(m["is_weight_p99"], 4.0)  # nearest rank: ceil(.99 * 5) = 5th smallest
    close(m["is_ess"], sum(rho) ** 2 / (5 * sum(x * x for x in rho)))
    close(m["is_truncated_frac"], 1 / 5)
    close([m["clip_frac_low"], m["clip_frac_high"], m["clip_frac_dual"]], [2 / 5, 1 / 5, 0.0])
    r_behave = [0.5 / 0.2, 1.0, 0.15 / 0.25, 0.55 / 0.5, 0.1 / 0.05]
    close(m["approx_kl_behave"], sum(r - 1 - math.log(r) for r in r_behave) / 5)
    assert m["tokens"] == 5.0 and m["loss"] == pytest.approx(m["pg_loss"])


def test_decoupled_ppo_without_cap_uses_raw_weight():
    out, _ = run("decoupled_ppo", LP, PROX, BEHAVE, ADV, MASK, params=LossParams(is_cap=None))
    close(out.loss, (-2.4 + 1.0 + 1.6 - 0.55 + 4 * 0.4) / 5)
    close(out.metrics["is_truncated_frac"], 0.0)


def test_asymmetric_clip_higher():
    # pi_prox = pi_behave = .4; eps_low .2, eps_high .28
    lp = logp([[0.5, 0.52, 0.3, 0.34]])  # r = 1.25, 1.3, .75, .85
    prox = logp([[0.4] * 4])
    adv = t([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    params = LossParams(eps_low=0.2, eps_high=0.28)
    out, grad = run("decoupled_ppo", lp, prox, prox, adv, mask, params=params)
    close(out.loss, (-1.25 - 1.28 + 0.8 + 0.85) / 4)
    close(grad, [[-1.25 / 4, 0.0, 0.0, 0.85 / 4]])  # 1.25 < 1.28 still learns
    close([out.metrics["clip_frac_high"], out.metrics["clip_frac_low"]], [1 / 4, 1 / 4])


def test_dual_clip_bounds_negative_advantage_loss():
    lp = logp([[0.4, 0.2, 0.4]])  # r = 4, 2, 4 against pi_prox = .1
    prox = logp([[0.1, 0.1, 0.1]])
    adv = t([[-1.0, -1.0, 1.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    out, grad = run("decoupled_ppo", lp, prox, prox, adv, mask, params=LossParams(clip_c=3.0))
    close(out.loss, (3.0 + 2.0 - 1.2) / 3)  # min(4, 3): -c*A caps the first token
    close(grad, [[0.0, 2.0 / 3, 0.0]])
    close(out.metrics["clip_frac_dual"], 1 / 3)
    off = LossParams(clip_c=None)
    _, grad_no_dual = run("decoupled_ppo", lp, prox, prox, adv, mask, params=off)
    close(grad_no_dual, [[4.0 / 3, 2.0 / 3, 0.0]])
    _, grad_default = run("decoupled_ppo", lp, prox, prox, adv, mask)  # default clip_c = 3 (verl)
    close(grad_default, grad)


def test_bypass_ignores_proximal():
    garbage = torch.full_like(LP, 7.0)
    out, grad = run("bypass_ppo", LP, garbage, BEHAVE, ADV, MASK)
    ref, ref_grad = run("decoupled_ppo", LP, BEHAVE, BEHAVE, ADV, MASK)
    none, _ = run("bypass_ppo", LP, None, BEHAVE, ADV, MASK)
    close(out.loss, ref.loss)
    close(none.loss, ref.loss)
    close(grad, ref_grad)
    close(out.metrics["is_ess"], 1.0)


# --------------------------------------------------------- equal log-prob sets


@pytest.mark.parametrize(("name", "objective"), PPO_FORMS + PG_FORMS + [("cispo", "ppo")])
def test_equal_logprobs_reduce_to_ppo_or_reinforce(name, objective):
    lp = logp([[0.5, 0.3, 0.2], [0.6, 0.1, 0.9]])
    adv = t([[1.0, -1.0, 2.0], [0.5, -0.5, 3.0]])
    params = LossParams(is_objective=objective, clip_c=3.0)
    out, grad = run(name, lp, lp, lp, adv, MASK, params=params)
    if name == "cispo" or objective == "pg":  # REINFORCE: -A log pi
        expected = -(adv * lp)[MASK].sum() / 5
    else:  # PPO at r = 1: -A
        expected = -adv[MASK].sum() / 5
    close(out.loss, expected)
    close(grad, torch.where(MASK, -adv / 5, 0))  # both forms: -A grad log pi
    m = out.metrics
    close([m["is_weight_mean"], m["is_weight_max"], m["is_weight_p99"], m["is_ess"]], [1.0] * 4)
    zeros = ["clip_frac_low", "clip_frac_high", "clip_frac_dual", "approx_kl_behave"]
    close([m[k] for k in zeros + ["is_truncated_frac", "is_masked_frac"]], [0.0] * 6)


# ----------------------------------------------------------- gradient routing


@pytest.mark.parametrize(("name", "objective"), PPO_FORMS + PG_FORMS + [("cispo", "ppo")])
def test_no_gradient_into_weights_advantages_or_reference(name, objective):
    prox, behave, adv = (x.clone().requires_grad_(True) for x in (PROX, BEHAVE, ADV))
    ref = PROX.clone().requires_grad_(True)
    lp = LP.clone().requires_grad_(True)
    params = LossParams(is_objective=objective, kl_coef=0.1)
    agg = make_aggregation("token_mean", MASK)
    inputs = LossInputs(lp, prox, behave, adv, MASK, agg, ref_logprobs=ref)
    POLICY_LOSSES[name](inputs, params).loss.backward()
    assert all(x.grad is None for x in (prox, behave, adv, ref))
    assert lp.grad is not None and lp.grad.abs().sum() > 0
    assert torch.all(lp.grad[~MASK] == 0)


@pytest.mark.parametrize(("name", "objective"), PPO_FORMS + PG_FORMS + [("cispo", "ppo")])
def test_masked_positions_never_matter(name, objective):
    """Prompt/padding positions may hold anything (NaN, inf): same loss, zero gradient."""
    mask = torch.tensor([[False, True, True], [True, True, False]])  # a prompt token, a pad
    dirty = lambda x, v: torch.where(mask, x, v)  # noqa: E731
    params = LossParams(is_objective=objective, kl_coef=0.1, entropy_coef=0.01)
    ent = t([[0.3, 0.2, 0.1], [0.5, 0.4, 0.6]])
    clean, clean_grad = run(name, LP, PROX, BEHAVE, ADV, mask, params=params,
                            ref_logprobs=PROX, entropy=ent)  # fmt: skip
    out, grad = run(
        name, dirty(LP, math.nan), dirty(PROX, math.inf), dirty(BEHAVE, -math.inf),
        dirty(ADV, math.nan), mask, params=params, ref_logprobs=dirty(PROX, math.nan),
        entropy=dirty(ent, math.inf),
    )  # fmt: skip
    close(out.loss, clean.loss)
    close(grad, clean_grad)
    assert torch.all(grad[~mask] == 0)
    assert all(math.isfinite(v) for v in out.metrics.values())
    assert out.metrics == pytest.approx(clean.metrics, rel=1e-9, abs=1e-12)


# ---------------------------------------------------------------- TIS / masked IS


def test_tis_ppo_is_decoupled_ppo_with_mandatory_cap():
    out, grad = run("tis", LP, PROX, BEHAVE, ADV, MASK)
    ref, ref_grad = run("decoupled_ppo", LP, PROX, BEHAVE, ADV, MASK)
    close(out.loss, ref.loss)
    close(grad, ref_grad)
    with pytest.raises(ValueError, match="is_cap"):
        run("tis", LP, PROX, BEHAVE, ADV, MASK, params=LossParams(is_cap=None))
    with pytest.raises(ValueError, match="proximal"):
        run("tis", LP, None, BEHAVE, ADV, MASK)


def test_tis_pg_by_hand():
    lp = logp([[0.5, 0.3, 0.15]])
    behave = logp([[0.2, 0.3, 0.25]])  # rho = sg(pi_theta)/pi_behave = 2.5, 1, .6
    adv = t([[1.0, -1.0, -2.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    out, grad = run("tis", lp, None, behave, adv, mask, params=LossParams(is_objective="pg"))
    w = [2.0, 1.0, 0.6]  # truncated at 2
    lps = [math.log(0.5), math.log(0.3), math.log(0.15)]
    close(out.loss, -sum(wi * a * li for wi, a, li in zip(w, [1, -1, -2], lps, strict=True)) / 3)
    close(grad, [[-2.0 / 3, 1.0 / 3, 1.2 / 3]])
    close(out.metrics["is_truncated_frac"], 1 / 3)
    close(out.metrics["is_weight_max"], 2.5)


def test_masked_is_token_level_by_hand():
    prox = logp([[0.5, 0.3, 0.2, 0.3]])
    behave = logp([[0.2, 0.3, 0.5, 0.2]])  # rho = 2.5 (out), 1, .4 (out), 1.5; bounds [.5, 2]
    adv = t([[1.0, 1.0, 1.0, -1.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    out, grad = run("masked_is", prox, prox, behave, adv, mask)  # pi_theta = pi_prox: r = 1
    close(out.loss, -(1.0 * 1.0 + 1.5 * -1.0) / 4)
    close(grad, [[0.0, -1.0 / 4, 0.0, 1.5 / 4]])
    close(out.metrics["is_masked_frac"], 2 / 4)


def test_masked_is_sequence_level_geometric_mean():
    # row 0: rho_t = 4, .25, 1 -> geometric mean 1 (kept, although 4 and .25 are out of bounds)
    # row 1: rho_t = 3, 3 -> 3 (whole sequence masked)
    prox = logp([[0.4, 0.1, 0.3], [0.6, 0.3, 0.5]])
    behave = logp([[0.1, 0.4, 0.3], [0.2, 0.1, 0.5]])
    adv = torch.where(MASK, 1.0, 0.0).to(D)
    params = LossParams(is_level="sequence")
    out, grad = run("masked_is", prox, prox, behave, adv, MASK, params=params)
    close(out.loss, -3.0 / 5)  # masked tokens still count in the denominator
    close(grad, [[-0.2, -0.2, -0.2], [0.0, 0.0, 0.0]])
    close([out.metrics["is_masked_frac"], out.metrics["is_weight_mean"]], [1 / 2, 2.0])
    token, _ = run("masked_is", prox, prox, behave, adv, MASK)
    close(token.loss, -1.0 / 5)  # token level keeps only the rho = 1 token of row 0


# ------------------------------------------------------------------ GSPO, CISPO


def test_gspo_sequence_ratio_and_clipping():
    # row 0: r_t = 2, .5, 1 -> s = 1 (token-level PPO would clip token 0); A = 2
    # row 1: r_t = 1.5, 1.5 -> s = 1.5 > 1.2, A = 1 -> whole sequence clipped
    prox = logp([[0.2, 0.4, 0.3], [0.2, 0.4, 0.5]])
    lp = logp([[0.4, 0.2, 0.3], [0.3, 0.6, 0.5]])
    adv = t([[2.0, 2.0, 2.0], [1.0, 1.0, 0.0]])
    agg = make_aggregation("seq_mean_token_mean", MASK)
    out, grad = run("gspo", lp, prox, prox, adv, MASK, agg=agg)
    close(out.loss, (-2.0 * 1.0 + -1.0 * 1.2) / 2)
    close(grad, [[-1 / 3, -1 / 3, -1 / 3], [0.0, 0.0, 0.0]])  # -A * s / L / num_seqs
    close(out.metrics["clip_frac_high"], 2 / 5)

    # the same gradient as the sequence-level objective -A_i * exp(mean_t log r) written directly
    x = lp.clone().requires_grad_(True)
    s0 = torch.exp((x[0] - prox[0]).mean())
    (direct,) = torch.autograd.grad(-2.0 * s0 / 2, x)
    close(grad[0], direct[0])


@pytest.mark.parametrize(
    ("eps_low", "weights", "low_frac"),
    [(None, [5.0, 0.5, 1.0], 0.0), (0.2, [5.0, 0.8, 1.0], 1 / 3)],
)
def test_cispo_by_hand(eps_low, weights, low_frac):
    prox = logp([[0.1, 0.4, 0.3]])
    lp = logp([[0.6, 0.2, 0.3]])  # r = 6 (clipped to 1 + 4), .5, 1
    adv = t([[1.0, -1.0, 2.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    params = LossParams(cispo_eps_low=eps_low, cispo_eps_high=4.0)
    out, grad = run("cispo", lp, prox, prox, adv, mask, params=params)
    lps = [math.log(0.6), math.log(0.2), math.log(0.3)]
    close(out.loss, -sum(w * a * li for w, a, li in zip(weights, [1, -1, 2], lps, strict=True)) / 3)
    close(grad, [[-w * a / 3 for w, a in zip(weights, [1, -1, 2], strict=True)]])  # clipped too
    close([out.metrics["clip_frac_high"], out.metrics["clip_frac_low"]], [1 / 3, low_frac])


def test_gspo_and_cispo_weight_by_the_truncated_behaviour_ratio():
    """pi_prox != pi_behave: each token's term is multiplied by w = min(pi_prox/pi_behave,
    is_cap), detached (no gradient through the weight)."""
    prox = logp([[0.4, 0.2, 0.3]])
    behave = logp([[0.1, 0.4, 0.3]])  # rho = 4 (capped at 2), 0.5, 1
    w = [2.0, 0.5, 1.0]
    adv = t([[1.0, 1.0, 1.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    # pi_theta = pi_prox: the GSPO sequence ratio and CISPO's r are 1 (inside every clip)
    g_out, g_grad = run("gspo", prox, prox, behave, adv, mask)
    close(g_out.loss, -sum(w) / 3)
    close(g_grad, [[-wi / 3 for wi in w]])
    c_out, c_grad = run("cispo", prox, prox, behave, adv, mask)
    close(c_out.loss, -sum(wi * math.log(p) for wi, p in zip(w, [0.4, 0.2, 0.3], strict=True)) / 3)
    close(c_grad, [[-wi / 3 for wi in w]])
    for out in (g_out, c_out):
        close([out.metrics["is_truncated_frac"], out.metrics["is_weight_max"]], [1 / 3, 4.0])


def test_sequence_level_truncation_uses_the_geometric_mean_per_sequence():
    """is_level=sequence with truncation (the gspo preset): rho_i = exp(mean_t log rho_t),
    capped at is_cap, one weight for the whole sequence."""
    # row 0: rho_t = 4, 4, 4 -> 4, capped at 2; row 1: rho_t = 2, 0.125 -> 0.5 (kept)
    prox = logp([[0.4, 0.4, 0.4], [0.4, 0.1, 0.5]])
    behave = logp([[0.1, 0.1, 0.1], [0.2, 0.8, 0.5]])
    adv = torch.where(MASK, 1.0, 0.0).to(D)
    params = LossParams(is_level="sequence", is_cap=2.0)
    out, grad = run("tis", prox, prox, behave, adv, MASK, params=params)  # r = 1: -w * A
    close(out.loss, -(3 * 2.0 + 2 * 0.5) / 5)
    close(grad, [[-2.0 / 5] * 3, [-0.5 / 5, -0.5 / 5, 0.0]])
    close([out.metrics["is_truncated_frac"], out.metrics["is_weight_max"]], [1 / 2, 4.0])
    close(out.metrics["is_weight_mean"], (4.0 + 0.5) / 2)


# ------------------------------------------------------------------ KL, entropy


@pytest.mark.parametrize(
    ("estimator", "expected"),
    [("k1", math.log(2)), ("k2", 0.5 * math.log(2) ** 2), ("k3", 0.5 - 1 + math.log(2))],
)
def test_kl_estimators_by_hand(estimator, expected):
    # pi_theta = .5, pi_ref = .25: x = log(pi_ref / pi_theta) = -log 2
    close(kl_penalty(logp([[0.5]]), logp([[0.25]]), estimator), [[expected]])


def test_kl_k3_is_bounded_and_rejects_unknown():
    close(kl_penalty(logp([[1e-6]]), logp([[0.9]]), "k3"), [[10.0]])
    with pytest.raises(ValueError, match="estimator"):
        kl_penalty(LP, PROX, "k4")


def test_kl_term_and_entropy_bonus_by_hand():
    lp, ref = logp([[0.5, 0.4, 0.3]]), logp([[0.25, 0.4, 0.9]])
    ent = t([[1.0, 2.0, 4.0]]).requires_grad_(True)
    mask = torch.tensor([[True, True, False]])
    adv = t([[1.0, 1.0, 1.0]])
    params = LossParams(kl_coef=0.1, kl_estimator="k3", entropy_coef=0.01)
    out, grad = run("bypass_ppo", lp, None, lp, adv, mask, params=params,
                    ref_logprobs=ref, entropy=ent)  # fmt: skip
    k3 = [0.5 - 1 + math.log(2), 0.0]
    close(out.loss, -1.0 + 0.1 * sum(k3) / 2 - 0.01 * (1.0 + 2.0) / 2)
    # d k3 / d log pi_theta = 1 - pi_ref / pi_theta
    close(grad, [[(-1 + 0.1 * (1 - 0.5)) / 2, -1 / 2, 0.0]])
    close([out.metrics["kl_ref"], out.metrics["entropy"]], [sum(k3) / 2, 1.5])
    agg = make_aggregation("token_mean", mask)
    inputs = LossInputs(lp, None, lp, adv, mask, agg, ref_logprobs=ref, entropy=ent)
    (ent_grad,) = torch.autograd.grad(POLICY_LOSSES["bypass_ppo"](inputs, params).loss, ent)
    close(ent_grad, [[-0.005, -0.005, 0.0]])


def test_kl_reward_mode_and_missing_inputs():
    params = LossParams(kl_coef=0.1, kl_mode="reward")
    out, _ = run("bypass_ppo", LP, None, BEHAVE, ADV, MASK, params=params, ref_logprobs=PROX)
    plain, _ = run("bypass_ppo", LP, None, BEHAVE, ADV, MASK)
    close(out.loss, plain.loss)  # the caller shapes rewards instead
    assert out.metrics["kl_ref"] > 0
    with pytest.raises(ValueError, match="ref_logprobs"):
        run("bypass_ppo", LP, None, BEHAVE, ADV, MASK, params=LossParams(kl_coef=0.1))
    with pytest.raises(ValueError, match="entropy"):
        run("bypass_ppo", LP, None, BEHAVE, ADV, MASK, params=LossParams(entropy_coef=0.1))


# ------------------------------------------------------------ params, registry, stats


@pytest.mark.parametrize(
    "bad",
    [
        {"eps_low": 1.0}, {"eps_high": -0.1}, {"clip_c": 1.0}, {"is_cap": 0.0},
        {"is_level": "batch"}, {"mask_low": 2.0}, {"is_objective": "a2c"},
        {"cispo_eps_low": 1.0}, {"cispo_eps_high": -1.0}, {"kl_coef": -1.0},
        {"kl_estimator": "k4"}, {"kl_mode": "both"},
    ],
)  # fmt: skip
def test_loss_params_reject_bad_values(bad):
    with pytest.raises(ValueError, match="LossParams"):
        LossParams(**bad)


def test_registry_keys():
    assert set(POLICY_LOSSES) == {
        "decoupled_ppo", "bypass_ppo", "tis", "masked_is", "gspo", "cispo"
    }  # fmt: skip
    assert AGGREGATION_MODES == (
        "token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm"
    )  # fmt: skip


def test_weight_stats_by_hand():
    s = weight_stats(torch.arange(1, 201, dtype=D))
    close([s["mean"], s["max"], s["p99"]], [100.5, 200.0, 198.0])  # ceil(.99 * 200) = 198
    close(weight_stats(t([1.0, 0.0, 0.0, 0.0]))["ess"], 0.25)
    close(weight_stats(t([3.0, 3.0]))["ess"], 1.0)
    close(weight_stats(t([]))["ess"], 0.0)
    close(masked_mean(t([[1.0, 5.0]]), torch.tensor([[True, False]])), 1.0)


def test_merge_metrics():
    parts = [
        {"loss": 0.5, "tokens": 1.0, "is_weight_max": 2.0, "is_weight_p99": 1.5, "is_ess": 1.0},
        {"loss": 0.25, "tokens": 3.0, "is_weight_max": 3.0, "is_weight_p99": 1.0, "is_ess": 0.5},
    ]
    assert merge_metrics(parts) == pytest.approx(
        {"loss": 0.75, "tokens": 4.0, "is_weight_max": 3.0, "is_weight_p99": 1.5,
         "is_ess": (1.0 * 1 + 0.5 * 3) / 4}
    )  # fmt: skip


def test_step_metrics_cover_every_update_not_only_the_last():
    from asyncrl.learner.algo.aggregation import mean_over_updates

    updates = [
        {"loss": 1.0, "tokens": 10.0, "is_weight_max": 3.0, "clip_frac_high": 0.5},
        {"loss": 3.0, "tokens": 30.0, "is_weight_max": 1.5, "clip_frac_high": 0.1},
    ]
    out = mean_over_updates(updates)
    close([out["loss"], out["tokens"]], [2.0, 20.0])  # each update's loss is a whole minibatch's
    close(out["is_weight_max"], 3.0)
    close(out["clip_frac_high"], (0.5 * 10 + 0.1 * 30) / 40)
    assert mean_over_updates(updates[:1]) == updates[0]
