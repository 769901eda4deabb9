"""The ``algorithm`` config group: loss, advantage estimator, aggregation, KL, clipping,
PPO epochs (docs/algorithms.md). Part of the schema in asyncrl/core/config/job.py."""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.core.config.checks import bound as _bound
from asyncrl.core.config.checks import require as _require
from asyncrl.core.config.checks import require_finite as _require_finite

# registry keys, repeated here so the CLI validates a config without importing torch;
# tests/unit/learner/test_step_registry.py checks they match asyncrl.learner.algo.losses / asyncrl.learner.algo.advantages
# Name lists with no code behind them here: their one home, which the learner imports
# (asyncrl.learner.algo.stale_tokens / aggregation / truncation) and tests/unit/learner check by use.
STALE_TOKEN_MODES = ("drop_group", "mask", "interpolate")
_LOSSES = ("decoupled_ppo", "bypass_ppo", "tis", "masked_is", "gspo", "cispo")
_ADVANTAGES = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "gae")
_AGGREGATIONS = (
    "token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_mean",
    "seq_mean_token_sum_norm",
)
KL_ESTIMATORS = ("k1", "k2", "k3")
TRUNCATION_MODES = ("keep", "mask", "penalize")


@dataclass
class AlgorithmConfig:
    """Loss, advantage estimator, reward shaping and the optional critic / reference model.

    Every field is a key ``algorithm.<field>``; ``configs/algorithm/<preset>.yaml`` sets the
    ones a recipe changes. Formulas and when to use each: docs/algorithms.md. The learner
    looks the loss and estimator up by name (``POLICY_LOSSES``, ``ADVANTAGE_ESTIMATORS``) and
    passes each estimator the fields named like its keyword arguments.
    """

    name: str = "grpo"
    """Preset name (informational)."""
    policy_loss: str = "decoupled_ppo"
    """A ``asyncrl.learner.algo.losses.POLICY_LOSSES`` key."""
    advantage: str = "grpo"
    """A ``asyncrl.learner.algo.advantages.ADVANTAGE_ESTIMATORS`` key; ``gae`` trains a critic."""
    aggregation: str = "token_mean"
    """How token losses become one loss (``asyncrl.learner.algo.aggregation.AGGREGATION_MODES``)."""
    # -- advantage estimator arguments (passed by name to the estimator that takes them)
    std_normalize: bool = True
    """grpo: divide by the group's reward std."""
    group_baseline: bool = False
    """reinforce_pp: subtract the group mean before whitening (REINFORCE++-baseline)."""
    gamma: float = 1.0
    """gae: discount per token, in (0, 1]."""
    lam: float = 1.0
    """gae: lambda of GAE, in [0, 1] (1 = Monte-Carlo return minus V)."""
    whiten: bool = False
    """gae: normalise advantages over the batch's tokens."""
    # -- policy loss (asyncrl.learner.algo.losses.LossParams: same names)
    eps_low: float = 0.2
    """PPO clip lower bound ``1 - eps_low``; eps_low in [0, 1)."""
    eps_high: float = 0.2
    """PPO clip upper bound ``1 + eps_high``, >= 0 (> eps_low = DAPO clip-higher)."""
    clip_c: float | None = 3.0
    """Dual-clip constant (> 1; verl's default 3): for A < 0 the loss is at most ``-c*A``, so a
    stale token with ratio > c and A < 0 adds a bounded loss and no gradient. null = off."""
    is_cap: float | None = 2.0
    """Truncate importance weights pi_prox/pi_behave at this value, > 0 (null = no cap)."""
    is_level: str = "token"
    """Importance weights per ``token`` or per ``sequence`` (geometric mean)."""
    mask_low: float = 0.5
    """masked_is: keep units with ``mask_low <= weight <= mask_high``; 0 <= mask_low."""
    mask_high: float = 2.0
    """masked_is: upper end of the kept weights (> mask_low)."""
    is_objective: str = "ppo"
    """tis / masked_is: ``ppo`` (clipped, recomputes pi_prox) or ``pg`` (REINFORCE)."""
    cispo_eps_low: float | None = None
    """cispo: weight >= 1 - this, in [0, 1) (null = no lower bound)."""
    cispo_eps_high: float = 4.0
    """cispo: weight <= 1 + this (>= 0)."""
    # -- KL to the reference policy and entropy bonus
    kl_coef: float = 0.0
    """Weight of KL(pi || pi_ref), >= 0; > 0 loads the reference model (the initial policy)."""
    kl_estimator: str = "k3"
    """``k1``, ``k2`` or ``k3``."""
    kl_mode: str = "loss"
    """``loss``: add kl_coef*KL to the loss; ``reward``: subtract it from the rewards."""
    entropy_coef: float = 0.0
    """Entropy bonus: loss -= entropy_coef * entropy (>= 0; a bonus, never a penalty)."""
    # -- critic (advantage estimators that take values, i.e. gae)
    critic_lr: float | None = None
    """Critic learning rate, > 0 (null = learner.lr; same warm-up)."""
    value_clip: float | None = 0.2
    """Clip the new value to old +- this in the value loss, > 0 (null = no clipping)."""
    # -- DAPO data and reward shaping
    dynamic_sampling: bool = False
    """Drop groups whose rewards are all equal (no signal) and read more to fill the batch."""
    overlong_frac: float = 0.0
    """Soft overlong penalty over the last ``overlong_frac * sampling.max_tokens`` tokens (0 = off)."""
    overlong_penalty: float = 1.0
    """Reward penalty at (and beyond) ``sampling.max_tokens`` (>= 0)."""
    # -- completions cut at sampling.max_tokens (finish_reason "length"; learner/algo/truncation.py)
    truncated: str = "keep"
    """``keep``: train on them as they are. ``mask``: they add no loss and leave the loss
    denominators; their reward still counts in their group's baseline (DAPO's overlong
    filtering). ``penalize``: their task reward is replaced by ``truncated_reward`` before the
    reward shaping and the advantage."""
    truncated_reward: float = 0.0
    """penalize: the reward a truncated completion gets (0 = scored as a failed answer)."""
    # -- tokens older than buffer.max_staleness (learner/algo/stale_tokens.py)
    stale_tokens: str = "drop_group"
    """``drop_group``: a group is trained or dropped whole by its oldest token. ``mask``: it is
    admitted while its newest token is within ``buffer.max_staleness``, and each older token
    leaves the loss (the rest of its completion trains). Not with ``advantage=gae`` (its value
    targets run over every token). ``interpolate``: admitted as under ``mask``, every token
    trains, each with a proximal log-prob estimated from its own version (AReaL's A-3PO; no
    forward pass recomputes it); not with ``policy_loss=bypass_ppo``, which has no proximal
    policy (docs/algorithms.md)."""
    # -- updates per step
    ppo_epochs: int = 1
    """Passes over the batch per step (>= 1)."""
    minibatches: int = 1
    """Optimizer updates per pass (slices of the batch), >= 1."""

    def __post_init__(self) -> None:
        _require_finite(self, "algorithm")
        a, name = self, "algorithm"
        _require(a.policy_loss in _LOSSES, f"{name}.policy_loss={a.policy_loss!r} not in {_LOSSES}")
        _require(
            a.advantage in _ADVANTAGES, f"{name}.advantage={a.advantage!r} not in {_ADVANTAGES}"
        )
        _require(a.aggregation in _AGGREGATIONS, f"{name}.aggregation not in {_AGGREGATIONS}")
        _require(
            a.stale_tokens in STALE_TOKEN_MODES,
            f"{name}.stale_tokens={a.stale_tokens!r} not in {STALE_TOKEN_MODES}",
        )
        _require(
            not (a.stale_tokens == "mask" and a.advantage == "gae"),
            f"{name}.stale_tokens=mask leaves holes in a completion, and advantage=gae's value "
            "targets run over every token: use stale_tokens=drop_group with gae",
        )
        _require(
            not (a.stale_tokens == "interpolate" and a.policy_loss == "bypass_ppo"),
            f"{name}.stale_tokens=interpolate estimates the proximal policy, which "
            "policy_loss=bypass_ppo does not use (it clips around the behaviour policy): use "
            "decoupled_ppo, or stale_tokens=mask",
        )
        _bound(a, "algorithm.eps_low", ge=0, lt=1)
        _bound(a, "algorithm.eps_high", ge=0)
        _bound(a, "algorithm.clip_c", gt=1, hint=" or null")
        _bound(a, "algorithm.is_cap", gt=0, hint=" or null (no cap)")
        _require(a.is_level in ("token", "sequence"), "algorithm.is_level in (token, sequence)")
        _bound(a, "algorithm.mask_low", ge=0)
        _require(
            a.mask_low < a.mask_high,
            f"need algorithm.mask_low < algorithm.mask_high, got {a.mask_low} and {a.mask_high}",
        )
        _require(a.is_objective in ("ppo", "pg"), "algorithm.is_objective in (ppo, pg)")
        _bound(a, "algorithm.cispo_eps_low", ge=0, lt=1, hint=" or null (no lower bound)")
        _bound(a, "algorithm.cispo_eps_high", ge=0)
        _bound(a, "algorithm.kl_coef", ge=0)
        _bound(a, "algorithm.entropy_coef", ge=0)
        _require(a.kl_estimator in KL_ESTIMATORS, f"algorithm.kl_estimator in {KL_ESTIMATORS}")
        _require(a.kl_mode in ("loss", "reward"), "algorithm.kl_mode in (loss, reward)")
        _require(
            not (a.kl_coef > 0 and a.kl_mode == "loss" and a.kl_estimator == "k1"),
            "algorithm.kl_estimator=k1 as a loss term has zero expected gradient; "
            "use kl_mode=reward, or k2/k3",
        )
        _bound(a, "algorithm.gamma", gt=0, le=1)
        _bound(a, "algorithm.lam", ge=0, le=1)
        _bound(a, "algorithm.critic_lr", gt=0, hint=" or null (= learner.lr)")
        _bound(a, "algorithm.value_clip", gt=0, hint=" or null (no clipping)")
        _bound(a, "algorithm.overlong_frac", ge=0, le=1, hint=" (0 = off)")
        _bound(a, "algorithm.overlong_penalty", ge=0)
        _require(
            a.truncated in TRUNCATION_MODES,
            f"algorithm.truncated={a.truncated!r} not in {TRUNCATION_MODES}: keep (train on cut "
            "completions), mask (no loss) or penalize (reward := algorithm.truncated_reward)",
        )
        _require(
            a.truncated == "penalize" or a.truncated_reward == 0.0,
            f"algorithm.truncated_reward={a.truncated_reward} is used only with "
            f"algorithm.truncated=penalize (got {a.truncated!r}); set algorithm.truncated="
            "penalize, or leave truncated_reward at 0",
        )
        _bound(a, "algorithm.ppo_epochs", ge=1)
        _bound(a, "algorithm.minibatches", ge=1)
