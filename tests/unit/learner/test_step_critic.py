"""The step with a critic and a reference model, in one process on a tiny random Qwen2:
values start at 0 and the value loss falls; every preset's step runs and exports the
diagnostics; the critic is checkpointed and restored with the policy."""

import random
from dataclasses import replace

import pytest
import torch

from asyncrl.core.config.job import AlgorithmConfig, Config, LearnerConfig
from asyncrl.core.config.load import load_config
from asyncrl.core.types import Group, Sample
from asyncrl.learner.algo.targets import compute_targets, uses_critic
from asyncrl.learner.compute.batch import collate
from asyncrl.learner.compute.critic import build_critic, explained_variance
from asyncrl.learner.compute.model import build_policy
from asyncrl.learner.compute.reference import build_reference
from asyncrl.learner.compute.step import StepContext, batch_metrics, train_on_batch
from asyncrl.learner.state.checkpoint import load_checkpoint, save_checkpoint
from tests.random_groups import random_groups

VOCAB = 32
PRESETS = ["grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp", "ppo"]
DIAGNOSTICS = [
    "is_weight_mean", "is_weight_max", "is_weight_p99", "is_ess", "is_truncated_frac",
    "is_masked_frac", "clip_frac_low", "clip_frac_high", "clip_frac_dual", "approx_kl_behave",
    "entropy", "loss", "grad_norm",
]  # fmt: skip


def _batch(n_groups=4, n=4, seed=0):
    return collate(random_groups(n_groups, n, seed, VOCAB))


def critic_config(algo: AlgorithmConfig, lr: float, grad_clip: float) -> Config:
    """The keys ``build_critic`` reads: ``algo`` (its ``value_clip``), AdamW at ``lr`` without
    weight decay, gradients clipped at ``grad_clip``; every other key at its default."""
    return Config(algorithm=replace(algo, critic_lr=lr), learner=LearnerConfig(grad_clip=grad_clip))


def _context(model_dir, algo, lr=1e-3):
    torch.manual_seed(0)
    model = build_policy(model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    critic = (
        build_critic(model_dir, critic_config(algo, lr, 1.0))
        if uses_critic(algo.advantage)
        else None
    )
    ref = build_reference(model_dir) if algo.kl_coef > 0 else None
    return StepContext(model, opt, algo, 0, 1, 1.0, critic=critic, reference=ref, max_tokens=5)


def test_values_start_at_zero_and_the_value_loss_falls(tiny_model):
    torch.set_num_threads(1)
    algo = load_config(["algorithm=ppo"]).algorithm
    critic = build_critic(tiny_model, critic_config(algo, 3e-3, 1.0))
    batch = _batch()
    v0 = critic.values(batch.input_ids, batch.attention_mask)
    assert v0.shape == batch.loss_mask.shape and torch.all(v0 == 0)
    targets = compute_targets(algo, batch.rewards, batch.loss_mask, values=v0)
    losses = []
    for _ in range(40):
        old = critic.values(batch.input_ids, batch.attention_mask)
        m = critic.update(batch, old, targets.returns, batch.loss_mask, world=1)
        losses.append(m["value_loss"])
    assert losses[-1] < 0.2 * losses[0], losses
    assert m["value_explained_var"] > 0.5


def _prompt_rewarded_batch(seed: int, n_groups=4, n=4):
    """Fresh completions each call for two prompts, one always rewarded and one never: the
    return is a function of the state, so a critic can learn it (a policy cannot change it)."""
    rng = random.Random(seed)
    groups = []
    for g in range(n_groups):
        good = rng.random() < 0.5
        prompt = [5, 6, 7] if good else [20, 21, 22]
        samples = [Sample(prompt, [rng.randrange(1, VOCAB) for _ in range(c)],
                          [-rng.uniform(0.5, 4.0) for _ in range(c)], [0] * c, float(good))
                   for c in (rng.randint(1, 5) for _ in range(n))]  # fmt: skip
        groups.append(Group(f"g{g}", g, 0, samples))
    return collate(groups)


def test_ppo_preset_step_trains_its_critic_the_value_loss_falls(tiny_model):
    """The whole ppo preset step (GAE, KL reward penalty, 2 minibatches, policy + critic
    updates) on fresh samples every step: the critic learns each prompt's value, so its value
    loss falls below a tenth of its start within 40 steps and its mean value tracks the mean
    return. (On the demo the value loss need
    not fall: the returns' variance grows as the reward rises, docs/algorithms.md.)"""
    torch.set_num_threads(1)
    algo = load_config(["algorithm=ppo"]).algorithm
    ctx = _context(tiny_model, algo, lr=3e-3)
    history = [train_on_batch(ctx, _prompt_rewarded_batch(seed)) for seed in range(40)]
    losses = [m["value_loss"] for m in history]
    first, last = sum(losses[:5]) / 5, sum(losses[-15:]) / 15
    assert last < 0.1 * first, [round(v, 4) for v in losses]
    gap = sum(abs(m["value_mean"] - m["returns_mean"]) for m in history[-15:]) / 15
    assert gap < 0.05, [(round(m["value_mean"], 2), round(m["returns_mean"], 2)) for m in history]


def test_explained_variance_closed_form():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    returns = torch.tensor([[0.0, 1.0, 9.0], [2.0, 3.0, 9.0]])  # masked: 0,1,2,3 (var 1.25)
    assert explained_variance(torch.full((2, 3), 7.0), returns, mask) == pytest.approx(0.0)
    assert explained_variance(returns.clone(), returns, mask) == pytest.approx(1.0)
    # V = 1.5 + (R - 1.5)/2: residual var 1.25/4 -> 1 - 1/4
    assert explained_variance(0.75 + returns / 2, returns, mask) == pytest.approx(0.75)
    assert explained_variance(returns, torch.ones(2, 3), mask) == 0.0  # constant returns


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_step_trains_and_exports_diagnostics(tiny_model, preset):
    torch.set_num_threads(1)
    overrides = [f"algorithm={preset}", "algorithm.ppo_epochs=2"]  # 2 updates: pi_prox used
    algo = load_config(overrides).algorithm
    ctx = _context(tiny_model, algo)
    before = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    metrics = train_on_batch(ctx, _batch())
    for key in DIAGNOSTICS:
        assert key in metrics and metrics[key] == metrics[key], key  # present, not NaN
    assert 0 < metrics["is_ess"] <= 1
    changed = [k for k, v in ctx.model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed, "the policy did not change"
    if algo.kl_coef > 0:
        assert "kl_ref" in metrics
        assert ("kl_loss" in metrics) == (algo.kl_mode == "loss")
        assert ("kl_reward_mean" in metrics) == (algo.kl_mode == "reward")
    if ctx.critic is not None:
        assert {"value_loss", "vf_clip_frac", "value_mean", "returns_mean"} <= set(metrics)
    if algo.overlong_frac > 0:
        assert "overlong_penalty_mean" in metrics


def test_batch_metrics_token_staleness():
    batch = _batch()
    m = batch_metrics(batch, version=3)  # every token sampled at version 0
    assert m["staleness_token_mean"] == 3.0
    lengths = batch.loss_mask.sum(-1)
    assert m["response_len_mean"] == pytest.approx(float(lengths.mean()))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP in one process
def test_critic_is_checkpointed_with_the_policy(tiny_model, tmp_path):
    torch.set_num_threads(1)
    algo = load_config(["algorithm=ppo"]).algorithm
    ctx = _context(tiny_model, algo)
    train_on_batch(ctx, _batch())
    extra = {"critic": (ctx.critic.model, ctx.critic.optimizer)}
    path = save_checkpoint(tmp_path, 1, ctx.model, ctx.optimizer, {"version": 1}, tiny_model,
                           extra=extra)  # fmt: skip
    saved = {k: v.clone() for k, v in ctx.critic.model.state_dict().items()}
    fresh = _context(tiny_model, algo)
    assert torch.all(fresh.critic.model.head.weight == 0)
    state = load_checkpoint(path, fresh.model, fresh.optimizer,
                            extra={"critic": (fresh.critic.model, fresh.critic.optimizer)})  # fmt: skip
    assert state["version"] == 1
    for k, v in fresh.critic.model.state_dict().items():
        torch.testing.assert_close(v, saved[k], rtol=0, atol=0, msg=k)
    assert fresh.critic.optimizer.state, "critic optimizer state was not restored"
