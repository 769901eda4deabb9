"""Episodes of several rows (``episode.agent_export=all``): an agent's other call chains are
samples of their own (``Sample.part`` >= 1) that share their episode's reward. The batch maps
rows to episodes, advantages are computed on episodes and given to each of their rows, and
padding rows (for minibatches x ranks) train nothing and change no loss."""

import pytest
import torch

from asyncrl.core.config.job import AlgorithmConfig
from asyncrl.core.types import Group, Sample
from asyncrl.learner.algo.advantages import grpo
from asyncrl.learner.algo.episodes import first_rows, per_episode, row_episodes, to_rows
from asyncrl.learner.algo.targets import compute_targets
from asyncrl.learner.compute.batch import collate, row_order
from asyncrl.learner.compute.model import build_policy
from asyncrl.learner.compute.step import StepContext, batch_metrics, train_on_batch

EP = torch.tensor([0, 0, 1, 2, 2, 2, 3, -1])
"""Rows of 4 episodes: episode 0 in two rows, 2 in three, and one padding row."""


def _sample(completion, reward, part=0, finish="stop", end="done"):
    c = len(completion)
    return Sample([1, 2], completion, [-0.5] * c, [0] * c, reward, finish, episode_end=end,
                  part=part)  # fmt: skip


def _groups():
    """Two groups of two episodes; episode 0 and 2 keep other call chains."""
    a = [_sample([3, 4], 1.0), _sample([5], 1.0, part=1), _sample([6, 7, 8], 0.0)]
    b = [_sample([9], 0.0), _sample([10, 11], 0.0, 1), _sample([12], 0.0, 2), _sample([13], 1.0)]
    return [Group("a", 0, 0, a), Group("b", 1, 0, b)]


def test_index_helpers():
    assert row_episodes(None, 3).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match=r"episode must be \[3\]"):
        row_episodes(torch.tensor([0, 1]), 3)
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 100.0])
    assert per_episode(values, EP, 4).tolist() == [3.0, 3.0, 15.0, 7.0]  # padding left out
    assert first_rows(EP, 4).tolist() == [0, 2, 3, 6]
    with pytest.raises(ValueError, match="episode 4 of 5 has no row"):
        first_rows(EP, 5)
    assert to_rows(torch.tensor([1.0, 2.0, 3.0, 4.0]), EP).tolist() == [1, 1, 2, 3, 3, 3, 4, 0]


def test_collate_maps_rows_to_episodes_and_pads():
    batch = collate(_groups(), world=4)
    assert batch.rewards.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert batch.episode.tolist() == [0, 0, 1, 2, 2, 2, 3, -1]
    pad = batch.rows(slice(7, 8))
    assert pad.attention_mask.sum() == 1 and pad.loss_mask.sum() == 0
    assert collate(_groups()).num_rows == 7  # no padding asked for
    assert collate(_groups(), world=7).num_rows == 7


def test_each_minibatch_holds_the_same_samples_whatever_the_ranks():
    """17 samples in 2 minibatches: 9 and 8 on one rank, padded to 10 and 10 on two."""
    one, two = row_order(17, 2, 1), row_order(17, 2, 2)
    assert one == [*range(9), *range(9, 17), -1]
    assert two == [*range(9), -1, *range(9, 17), -1, -1]
    for m in range(2):  # minibatch m: the same samples
        assert [k for k in one[9 * m : 9 * m + 9] if k >= 0] == [
            k for k in two[10 * m : 10 * m + 10] if k >= 0
        ]
    assert row_order(16, 2, 2) == list(range(16)) and row_order(7, 1, 1) == list(range(7))


def test_every_row_gets_its_episodes_advantage():
    batch = collate(_groups(), world=4)
    t = compute_targets(AlgorithmConfig(advantage="grpo"), batch.rewards, batch.loss_mask,
                        episode=batch.episode)  # fmt: skip
    expected = to_rows(grpo(batch.rewards).reshape(-1), batch.episode)
    rows = (t.advantages * batch.loss_mask).sum(-1) / batch.loss_mask.sum(-1).clamp(min=1)
    assert torch.allclose(rows, expected)
    assert t.advantages[7].abs().sum() == 0  # the padding row


def test_shaping_counts_an_episode_once_over_its_rows():
    """Truncation is the episode's first row's; its length (overlong) and KL sum its rows:
    splitting one row's tokens over two rows of the episode changes no advantage."""
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    split = torch.tensor([[1.0, 1, 0, 0], [0, 0, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    kl = torch.full((4, 4), 0.1)
    algo = AlgorithmConfig(advantage="dr_grpo", overlong_frac=0.5, truncated="penalize",
                           truncated_reward=-1.0, kl_coef=0.5, kl_mode="reward")  # fmt: skip
    rewards = torch.tensor([[1.0, 0.0, 1.0]])
    one = compute_targets(algo, rewards, mask, kl=kl[:3], max_tokens=4,
                          truncated=torch.tensor([0.0, 1.0, 0.0]))  # fmt: skip
    two = compute_targets(algo, rewards, split, kl=kl, max_tokens=4,
                          truncated=torch.tensor([0.0, 1.0, 1.0, 0.0]),  # a part's own cut
                          episode=torch.tensor([0, 0, 1, 2]))  # fmt: skip
    per_row = lambda t, m: (t.advantages * m).sum(-1) / m.sum(-1)  # noqa: E731
    assert torch.allclose(per_row(two, split)[[0, 2, 3]], per_row(one, mask))
    assert torch.allclose(per_row(two, split)[1], per_row(one, mask)[0])
    assert one.metrics == pytest.approx(two.metrics)


def test_a_critic_ends_each_row_with_its_episodes_reward():
    batch = collate(_groups(), world=4)
    algo = AlgorithmConfig(advantage="gae", gamma=1.0, lam=1.0, whiten=False)
    values = torch.zeros_like(batch.loss_mask)
    t = compute_targets(algo, batch.rewards, batch.loss_mask, values=values,
                        episode=batch.episode)  # fmt: skip
    assert t.returns is not None
    first = batch.loss_mask.argmax(-1)
    got = t.returns[torch.arange(batch.num_rows), first] * (batch.loss_mask.sum(-1) > 0)
    assert got.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]


def test_padding_rows_change_no_loss_and_metrics_count_samples(tiny_model):
    """The same groups trained with and without padding rows: the same loss and gradient
    norm (empty rows neither contribute nor dilute), two minibatches of four rows."""
    torch.set_num_threads(1)
    algo = AlgorithmConfig(advantage="grpo", aggregation="seq_mean_token_mean")
    out = []
    for world in (1, 8):
        torch.manual_seed(0)
        model = build_policy(tiny_model)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        ctx = StepContext(model, opt, algo, 0, 1, 1.0, max_tokens=5)
        out.append(train_on_batch(ctx, collate(_groups(), world=world)))
    assert out[0]["loss"] == pytest.approx(out[1]["loss"], rel=1e-5)
    assert out[0]["grad_norm"] == pytest.approx(out[1]["grad_norm"], rel=1e-5)
    with pytest.raises(ValueError, match="7 rows do not split into 2 minibatches"):
        ctx.algo = AlgorithmConfig(minibatches=2)
        train_on_batch(ctx, collate(_groups()))
    ctx.algo = AlgorithmConfig(minibatches=2)
    assert train_on_batch(ctx, collate(_groups(), minibatches=2))["nonfinite_updates"] == 0
    m = batch_metrics(collate(_groups(), world=8), version=0)
    assert m["samples_per_episode"] == pytest.approx(7 / 4)
    assert m["response_len_mean"] == pytest.approx(11 / 7)  # the padding row is no sample
    assert "samples_per_episode" not in batch_metrics(collate(_one()), 0)


def _one():
    return [Group("c", 2, 0, [_sample([3], 1.0), _sample([4], 0.0)])]
