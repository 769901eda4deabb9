"""``algorithm.stale_tokens`` (learner/algo/stale_tokens.py): tokens older than the bound
leave the loss under ``mask``, the rest of their completion trains; groups are admitted by
their newest token then. Under ``interpolate`` every token trains with a proximal log-prob
estimated from its own version (A-3PO). Closed-form cases, and each step's equivalence with a
step computed another way."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from asyncrl.buffer.staleness import split_by_staleness
from asyncrl.core.config.job import AlgorithmConfig
from asyncrl.core.config.load import ConfigError, load_config
from asyncrl.learner.algo.stale_tokens import (
    STALE_TOKEN_MODES,
    interpolated_proximal,
    masked_stale,
    stale_loss_mask,
)
from asyncrl.learner.compute.batch import collate
from asyncrl.learner.compute.model import build_policy
from asyncrl.learner.compute.step import StepContext, batch_metrics, train_on_batch
from tests.random_groups import random_groups

MASK = torch.tensor([[0.0, 1, 1, 1, 1], [0, 0, 1, 1, 0]])
VERSIONS = torch.tensor([[-1, 3, 4, 5, 6], [-1, -1, 6, 6, -1]])


def test_every_mode_the_config_accepts_is_one_the_learner_applies():
    """The names live once, in core (asyncrl/core/config/algorithm.py); each is used here."""
    for mode in STALE_TOKEN_MODES:
        load_config([f"algorithm.stale_tokens={mode}"])
        assert stale_loss_mask(MASK, VERSIONS, 6, 1, mode).shape == MASK.shape
    with pytest.raises(ValueError, match="not in"):
        stale_loss_mask(MASK, VERSIONS, 6, 1, "drop_tokens")


def test_mask_zeroes_exactly_the_tokens_older_than_the_bound():
    """At version 6 with max_staleness 1: versions 3 and 4 are stale, 5 and 6 are fresh."""
    got = stale_loss_mask(MASK, VERSIONS, 6, 1, "mask")
    assert got.tolist() == [[0.0, 0, 0, 1, 1], [0, 0, 1, 1, 0]]
    assert masked_stale(MASK, VERSIONS, 6, 1) == 2 and masked_stale(MASK, VERSIONS, 6, 3) == 0
    assert stale_loss_mask(MASK, VERSIONS, 6, 1, "drop_group") is MASK
    assert stale_loss_mask(MASK, VERSIONS, 6, 1, "interpolate") is MASK  # every token trains
    with pytest.raises(ValueError, match="not in"):
        stale_loss_mask(MASK, VERSIONS, 6, 1, "bogus")


def _group(gid: str, versions: list[int]):
    g = random_groups(1, 2, seed=1)[0]
    samples = [dataclasses.replace(s, token_versions=[versions[0]] * (len(s.completion_ids) - 1)
                                   + [versions[1]]) for s in g.samples]  # fmt: skip
    return dataclasses.replace(g, group_id=gid, samples=samples, version_min=-1, version_max=-1)


def test_admission_by_the_newest_token_keeps_a_group_with_a_fresh_tail():
    long_ = _group("long", [2, 5])  # started at 2, finished at 5
    old = _group("old", [2, 3])
    fresh, stale = split_by_staleness([long_, old], 5, 1)
    assert [g.group_id for g in stale] == ["long", "old"] and not fresh  # by the oldest
    fresh, stale = split_by_staleness([long_, old], 5, 1, by_newest=True)
    assert [g.group_id for g in fresh] == ["long"] and [g.group_id for g in stale] == ["old"]


def test_gae_is_refused_with_mask():
    with pytest.raises(ConfigError, match="stale_tokens=mask leaves holes"):
        load_config(["algorithm=ppo", "algorithm.stale_tokens=mask"])
    assert load_config(["algorithm.stale_tokens=mask"]).algorithm.stale_tokens == "mask"


def _mixed_groups():
    """4 groups whose samples' tokens come from versions 2..5 (a long completion spans
    several); at version 5 with max_staleness 1, the version-2 and -3 tokens are stale."""
    groups = random_groups(4, 4, seed=3)
    out = []
    for gi, g in enumerate(groups):
        samples = []
        for si, s in enumerate(g.samples):
            c = len(s.completion_ids)
            vs = [min(5, 2 + gi % 2 + (j + si) % 3) for j in range(c)]
            samples.append(dataclasses.replace(s, token_versions=vs))
        out.append(dataclasses.replace(g, samples=samples, version_min=-1, version_max=-1))
    return out


def _ctx(model_dir, algo):
    torch.manual_seed(0)
    model = build_policy(model_dir)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    return StepContext(model, opt, algo, 0, 1, grad_clip=1e9, max_tokens=5)


def test_the_masked_step_equals_the_step_on_the_hand_masked_batch(tiny_model):
    """Same advantages (rewards untouched), the stale tokens out of the loss and of the
    token_mean denominator: the same update as zeroing them in the batch's loss mask."""
    torch.set_num_threads(1)
    groups = _mixed_groups()
    batch = collate(groups)
    stale = masked_stale(batch.loss_mask, batch.token_versions, 5, 1)
    assert 0 < stale < int(batch.loss_mask.sum())  # not vacuous: some, not all
    ctx = _ctx(tiny_model, AlgorithmConfig(stale_tokens="mask"))
    masked = train_on_batch(ctx, collate(groups), version=5, max_staleness=1)
    w_masked = {k: v.detach().clone() for k, v in ctx.model.state_dict().items()}
    by_hand_batch = collate(groups)
    by_hand_batch.loss_mask = stale_loss_mask(by_hand_batch.loss_mask,
                                              by_hand_batch.token_versions, 5, 1, "mask")  # fmt: skip
    hand = _ctx(tiny_model, AlgorithmConfig())
    by_hand = train_on_batch(hand, by_hand_batch)
    assert masked["tokens"] == by_hand["tokens"] == int(batch.loss_mask.sum()) - stale
    for name, ref in hand.model.state_dict().items():
        torch.testing.assert_close(w_masked[name], ref.detach(), rtol=1e-5, atol=1e-6, msg=name)
    plain = _ctx(tiny_model, AlgorithmConfig(stale_tokens="mask"))
    unmasked = train_on_batch(plain, collate(groups))  # no version: nothing is masked
    assert unmasked["tokens"] == int(batch.loss_mask.sum())
    assert batch_metrics(batch, 5, 1)["tokens_masked_stale"] == stale


def test_interpolation_closed_form():
    """log pi_prox = b + (V - v) / (V + 1 - v) (c - b): fresh -> b, k old -> b + k/(k+1) (c - b);
    not a completion token -> c; a token newer than the learner counts as fresh."""
    b = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0]])
    c = torch.tensor([[-9.0, -1.0, -1.0, -1.0, -1.0]], requires_grad=True)
    v = torch.tensor([[-1, 6, 5, 3, 7]])
    got = interpolated_proximal(b, c, v, 6)
    want = [-9.0, -2.0, -3.0 + 0.5 * 2.0, -4.0 + 0.75 * 3.0, -5.0]
    torch.testing.assert_close(got, torch.tensor([want]))
    assert not got.requires_grad  # pi_prox is a constant of the loss


def test_interpolate_is_refused_where_no_proximal_policy_is_used():
    with pytest.raises(ConfigError, match="bypass_ppo does not use"):
        load_config(["algorithm.stale_tokens=interpolate", "algorithm.policy_loss=bypass_ppo"])
    cfg = load_config(["algorithm.stale_tokens=interpolate"])
    assert cfg.algorithm.stale_tokens == "interpolate"


def _counting(model):
    """Count the model's forward calls (the policy's own and every no-grad pi_prox pass)."""
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


def test_interpolate_runs_no_proximal_forward_with_several_updates(tiny_model):
    """A-3PO's point: with 2 minibatches the other modes run a no-grad pi_prox pass first."""
    torch.set_num_threads(1)
    groups = _mixed_groups()
    counts, tokens = {}, {}
    for mode in ("drop_group", "interpolate"):
        ctx = _ctx(tiny_model, AlgorithmConfig(stale_tokens=mode, minibatches=2))
        calls = _counting(ctx.model.model)
        metrics = train_on_batch(ctx, collate(groups), version=5, max_staleness=1)
        counts[mode], tokens[mode] = len(calls), metrics["tokens"]
    assert counts["interpolate"] * 2 == counts["drop_group"], counts
    assert tokens["interpolate"] == tokens["drop_group"]  # nothing masked


def test_interpolate_on_fresh_tokens_is_ppo_around_the_behaviour_policy(tiny_model):
    """Every token at the learner's version: pi_prox = pi_b, so the update is
    ``bypass_ppo``'s (decoupled PPO with pi_prox := pi_b); with stale tokens it is not."""
    torch.set_num_threads(1)
    fresh = [dataclasses.replace(g, samples=[dataclasses.replace(
        s, token_versions=[5] * len(s.completion_ids)) for s in g.samples])
        for g in _mixed_groups()]  # fmt: skip
    runs = {}
    for name, algo, groups in (
        ("interpolate", AlgorithmConfig(stale_tokens="interpolate"), fresh),
        ("bypass", AlgorithmConfig(policy_loss="bypass_ppo"), fresh),
        ("stale", AlgorithmConfig(stale_tokens="interpolate"), _mixed_groups()),
    ):
        ctx = _ctx(tiny_model, algo)
        train_on_batch(ctx, collate(groups), version=5, max_staleness=4)
        runs[name] = {k: v.detach().clone() for k, v in ctx.model.state_dict().items()}
    moved = 0.0
    for name, ref in runs["bypass"].items():
        torch.testing.assert_close(runs["interpolate"][name], ref, rtol=1e-5, atol=1e-6, msg=name)
        moved = max(moved, float((runs["stale"][name] - ref).abs().max()))
    assert moved > 1e-6  # stale tokens change the update (the test would see a no-op)
