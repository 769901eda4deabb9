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
    with pytest.raises(ValueError, match="same number of samples"):
        collate([_group("a", [1], [[2], [3]], [0, 1]), _group("b", [1], [[2]], [0])])


def test_shard_rows_splits_evenly_and_refuses_uneven():
    b = collate([_group("a", [1], [[2], [3], [4], [5]], [0, 1, 0, 1])])
    halves = [shard_rows(b, r, 2).input_ids for r in range(2)]
    assert torch.equal(torch.cat(halves), b.input_ids)
    with pytest.raises(ValueError, match="evenly"):
        shard_rows(b, 0, 3)
