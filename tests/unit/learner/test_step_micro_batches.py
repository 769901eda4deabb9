"""Gradient accumulation (``learner.micro_batch_rows``): a policy update computed in
micro-batches of rows equals the update on all rows at once (loss, metrics and new weights),
for every aggregation mode, with one or two minibatches and a reference model's KL term."""

import pytest
import torch

from asyncrl.core.config.load import load_config
from asyncrl.learner.algo.targets import uses_critic
from asyncrl.learner.compute.critic import build_critic
from asyncrl.learner.compute.model import build_policy
from asyncrl.learner.compute.reference import build_reference
from asyncrl.learner.compute.step import StepContext, train_on_batch
from tests.unit.learner.test_step_critic import _batch, critic_config


def _step(model_dir, algo, micro_batch_rows):
    torch.manual_seed(0)
    model = build_policy(model_dir)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ref = build_reference(model_dir) if algo.kl_coef > 0 else None
    critic = None
    if uses_critic(algo.advantage):
        critic = build_critic(model_dir, critic_config(algo, 1e-3, 1e9))
    ctx = StepContext(model, opt, algo, 0, 1, grad_clip=1e9, reference=ref, max_tokens=5,
                      micro_batch_rows=micro_batch_rows, critic=critic)  # fmt: skip
    metrics = train_on_batch(ctx, _batch(n_groups=4, n=4))
    return metrics, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(
    "overrides",
    [
        [
            "algorithm.aggregation=seq_mean_token_mean",
            "algorithm.minibatches=2",
            "algorithm.entropy_coef=0.01",
        ],
        # seq_mean_token_sum_norm, KL as a loss term, two epochs (pi_prox forwards chunked)
        [
            "algorithm=dr_grpo",
            "algorithm.kl_coef=0.1",
            "algorithm.kl_mode=loss",
            "algorithm.ppo_epochs=2",
        ],
        ["algorithm=ppo"],  # token_mean, critic V_old and pi_ref forwards chunked too
    ],  # fmt: skip
)
def test_micro_batches_give_the_same_update(tiny_model, overrides):
    torch.set_num_threads(1)
    algo = load_config(overrides).algorithm
    whole, w_whole = _step(tiny_model, algo, 0)
    micro, w_micro = _step(tiny_model, algo, 3)  # 16 rows (8 per minibatch) in slices of 3
    for key in ("loss", "pg_loss", "tokens", "is_weight_max", "clip_frac_high", "entropy"):
        assert micro[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-7), key
    for name, ref in w_whole.items():
        torch.testing.assert_close(w_micro[name], ref, rtol=1e-5, atol=1e-6, msg=name)
    init = build_policy(tiny_model).state_dict()
    assert any(not torch.equal(init[k], v) for k, v in w_whole.items()), "no update happened"
