"""Config <-> registries: every name the config accepts is a registry key and back; every
preset names real entries; the loss knobs and estimator arguments are wired by name."""

from dataclasses import fields
from pathlib import Path

import pytest
import torch

from asyncrl.core.config import job as config_module
from asyncrl.core.config.job import AlgorithmConfig
from asyncrl.core.config.load import CONFIG_DIR, ConfigError, load_config
from asyncrl.learner.algo.advantages import ADVANTAGE_ESTIMATORS, grpo, reinforce_pp
from asyncrl.learner.algo.aggregation import kl_penalty
from asyncrl.learner.algo.losses import AGGREGATION_MODES, KL_ESTIMATORS, POLICY_LOSSES, LossParams
from asyncrl.learner.algo.targets import estimator_kwargs, uses_critic
from asyncrl.learner.compute.step import loss_params

PRESETS = sorted(p.stem for p in (Path(CONFIG_DIR) / "algorithm").glob("*.yaml"))


def test_config_names_match_the_registries():
    assert set(config_module._LOSSES) == set(POLICY_LOSSES)
    assert set(config_module._ADVANTAGES) == set(ADVANTAGE_ESTIMATORS)
    assert set(config_module._AGGREGATIONS) == set(AGGREGATION_MODES)


def test_every_kl_estimator_the_config_accepts_gives_a_finite_penalty():
    """The names live once, in core; each is an estimator kl_penalty computes."""
    logprobs, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    for name in KL_ESTIMATORS:
        load_config([f"algorithm.kl_estimator={name}"])
        assert torch.isfinite(kl_penalty(logprobs, ref, name)).all(), name
    with pytest.raises(ValueError, match="not in"):
        kl_penalty(logprobs, ref, "k4")


def test_every_loss_knob_is_a_config_key_with_the_same_default():
    algo = AlgorithmConfig()
    for f in fields(LossParams):
        assert getattr(algo, f.name) == f.default, f.name
    custom = AlgorithmConfig(eps_high=0.28, is_level="sequence", kl_coef=0.1, kl_mode="reward")
    p = loss_params(custom)
    assert (p.eps_high, p.is_level, p.kl_coef, p.kl_mode) == (0.28, "sequence", 0.1, "reward")


def test_estimators_get_their_keyword_arguments_by_name():
    algo = AlgorithmConfig(std_normalize=False, group_baseline=True, lam=0.9, whiten=True)
    assert estimator_kwargs(grpo, algo) == {"std_normalize": False}
    assert estimator_kwargs(reinforce_pp, algo) == {"group_baseline": True}
    assert estimator_kwargs(ADVANTAGE_ESTIMATORS["gae"], algo) == {
        "gamma": 1.0,
        "lam": 0.9,
        "whiten": True,
    }
    assert estimator_kwargs(ADVANTAGE_ESTIMATORS["rloo"], algo) == {}


def test_only_gae_needs_a_critic():
    assert [name for name in ADVANTAGE_ESTIMATORS if uses_critic(name)] == ["gae"]


def test_all_presets_exist():
    assert set(PRESETS) >= {"grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp", "ppo"}


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_switches_the_whole_recipe(preset):
    algo = load_config([f"algorithm={preset}"]).algorithm
    assert algo.name == preset
    assert algo.policy_loss in POLICY_LOSSES and algo.advantage in ADVANTAGE_ESTIMATORS
    loss_params(algo)  # the learner's own validation accepts it


def test_preset_specifics():
    cfg = {p: load_config([f"algorithm={p}"]).algorithm for p in PRESETS}
    assert cfg["dapo"].dynamic_sampling and cfg["dapo"].eps_high > cfg["dapo"].eps_low
    assert cfg["dapo"].overlong_frac > 0
    assert cfg["dr_grpo"].aggregation == "seq_mean_token_sum_norm"
    assert cfg["gspo"].policy_loss == "gspo" and cfg["gspo"].eps_high < 1e-3
    assert cfg["ppo"].advantage == "gae" and cfg["ppo"].value_clip is not None
    assert cfg["reinforce_pp"].kl_coef > 0 and cfg["ppo"].kl_mode == "reward"
    assert cfg["grpo"].kl_coef == 0  # no reference model in the default recipe


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.advantage=nope"], "algorithm.advantage"),
        (["algorithm.aggregation=nope"], "algorithm.aggregation"),
        (["algorithm.kl_coef=0.1", "algorithm.kl_estimator=k1"], "k1 as a loss term"),
        (["algorithm.kl_mode=both"], "algorithm.kl_mode"),
        (["algorithm.overlong_frac=2"], "algorithm.overlong_frac"),
        (["algorithm.mask_low=3"], "algorithm.mask_low"),
        (["algorithm=dapo", "mode=sync"], "dynamic_sampling"),
        (["algorithm.critic_lr=0"], "algorithm.critic_lr"),
    ],
)
def test_bad_algorithm_config_names_the_problem(overrides, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_config(overrides)
