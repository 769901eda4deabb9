"""Group -> padded tensors: masks and log-probs land on the shifted grid of token_logprobs."""

import pytest
import torch

from asyncrl.core.types import Group, Sample
from asyncrl.learner.compute.batch import collate, shard_rows


def _group(gid, prompt, completions, rewards, version=3):
    samples = [
        Sample(prompt, c, [-0.1 * (j + 1) for j in range(len(c))], [version] * len(c), r)
        for c, r in zip(completions, rewards, strict=True)
    ]
    return Group(gid, 0, 0, samples)


def test_collate_aligns_completion_tokens_on_shifted_grid():
    g = _group("a", [5, 6, 7], [[8, 9], [10]], [1.0, 0.0])
    b = collate([g])
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 6, 7, 10, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # position t scores token t+1: completion tokens (indices 3, 4) are scored at 2, 3
    assert b.loss_mask.tolist() == [[0, 0, 1, 1], [0, 0, 1, 0]]
    assert torch.allclose(b.behavior_logprobs, torch.tensor([[0, 0, -0.1, -0.2], [0, 0, -0.1, 0]]))
    assert b.token_versions.tolist() == [[-1, -1, 3, 3], [-1, -1, 3, -1]]
    assert b.rewards.tolist() == [[1.0, 0.0]]


def test_collate_masked_tokens_are_exactly_the_completions():
    groups = [
        _group("a", [1, 2], [[3, 4, 5], [6]], [0, 1]),
        _group("b", [1, 2, 3, 4], [[7], [8, 9]], [1, 1]),
    ]
    b = collate(groups)
    for row in range(b.num_rows):
        picked = b.input_ids[row, 1:][b.loss_mask[row].bool()].tolist()
        s = [s for g in groups for s in g.samples][row]
        assert picked == s.completion_ids


def test_collate_rejects_ragged_group_sizes():
    with pytest.raises(ValueError, match="same number of episodes"):
        collate([_group("a", [1], [[2], [3]], [0, 1]), _group("b", [1], [[2]], [0])])


def test_shard_rows_splits_evenly_and_refuses_uneven():
    b = collate([_group("a", [1], [[2], [3], [4], [5]], [0, 1, 0, 1])])
    halves = [shard_rows(b, r, 2).input_ids for r in range(2)]
    assert torch.equal(torch.cat(halves), b.input_ids)
    with pytest.raises(ValueError, match="evenly"):
        shard_rows(b, 0, 3)


def _two_turns(episode_end="done", finish_reason="stop"):
    """Prompt [5, 6]; turn 1 sampled 8, 9 at version 3; the environment's tokens 20, 21 (mask
    0, log-prob 0, the version of the token before them); turn 2 sampled 10 at version 4."""
    logprobs, versions = [-0.1, -0.2, 0.0, 0.0, -0.3], [3, 3, 3, 3, 4]
    mask, end = [1, 1, 0, 0, 1], episode_end
    return Sample(
        [5, 6],
        [8, 9, 20, 21, 10],
        logprobs,
        versions,
        1.0,
        finish_reason,
        loss_mask=mask,
        turns=2,
        tool_calls=1,
        episode_end=end,
    )


def test_collate_a_two_turn_episode_trains_only_its_model_tokens():
    one_turn = Sample([5, 6], [7], [-0.5], [2], 0.0)
    b = collate([Group("a", 0, 0, [_two_turns(), one_turn])])
    assert b.input_ids.tolist() == [[5, 6, 8, 9, 20, 21, 10], [5, 6, 7, 0, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1] * 7, [1, 1, 1, 0, 0, 0, 0]]
    # shifted grid: completion token j (at p + j) is scored at p + j - 1 = 1 + j
    assert b.loss_mask.tolist() == [[0, 1, 1, 0, 0, 1], [0, 1, 0, 0, 0, 0]]
    want = torch.tensor([[0, -0.1, -0.2, 0, 0, -0.3], [0, -0.5, 0, 0, 0, 0]])
    assert torch.equal(b.behavior_logprobs, want)
    odd = _two_turns()  # a log-prob on an environment token is never used
    odd.behavior_logprobs[2:4] = [-9.0, -9.0]
    assert torch.equal(collate([Group("a", 0, 0, [odd])]).behavior_logprobs, want[:1])
    # the environment's tokens carry version 3 in the sample but are judged by no staleness
    assert b.token_versions.tolist() == [[-1, 3, 3, -1, -1, 4], [-1, 2, -1, -1, -1, -1]]
    assert b.truncated.tolist() == [0.0, 0.0]


@pytest.mark.parametrize(
    ("end", "finish", "cut"),
    [("done", "stop", 0.0), ("done", "length", 1.0), ("max_turns", "stop", 1.0),
     ("max_tokens", "stop", 1.0), ("length", "length", 1.0), ("env_timeout", "stop", 1.0),
     ("env_error", "stop", 1.0)],
)  # fmt: skip
def test_collate_an_episode_cut_by_a_limit_is_truncated(end, finish, cut):
    """``algorithm.truncated`` treats an episode cut short as a completion cut at the limit."""
    assert collate([Group("a", 0, 0, [_two_turns(end, finish)])]).truncated.tolist() == [cut]
