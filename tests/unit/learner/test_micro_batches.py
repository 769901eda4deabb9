"""Micro-batch plans (learner/compute/micro_batches.py): packing by a token budget, splitting to a
common count, scattering back to the rows' grid; and the premise that makes trimming exact: a
right-padded row's outputs on its real tokens do not depend on the padding columns after it."""

import pytest
import torch

from asyncrl.learner.compute.batch import Batch
from asyncrl.learner.compute.micro_batches import (
    plan_micro_batches,
    row_groups,
    run_planned,
    split_to,
    token_groups,
)
from asyncrl.learner.compute.model import build_policy, token_logprobs


@pytest.mark.parametrize(
    ("lengths", "budget", "groups"),
    [
        # longest first: 10 alone (2 x 10 > 12), 7 alone (2 x 7 > 12), then 3, 3, 2 (3 x 3 <= 12)
        ([10, 3, 7, 3, 2], 12, [[0], [2], [1, 3, 4]]),
        # 10 is longer than the budget: a micro-batch of its own, not an error
        ([10, 3, 7, 3, 2], 8, [[0], [2], [1, 3], [4]]),
        ([4, 4, 4, 4], 16, [[0, 1, 2, 3]]),  # exactly the budget
        ([4, 4, 4, 4], 15, [[0, 1, 2], [3]]),
        ([5], 1, [[0]]),
    ],
)
def test_token_groups_pack_longest_first_within_the_budget(lengths, budget, groups):
    assert token_groups(lengths, budget) == groups
    for g in groups:  # every multi-row group fits; only a single row may exceed the budget
        assert len(g) == 1 or len(g) * max(lengths[i] for i in g) <= budget


def test_split_to_cuts_the_largest_splittable_micro_batch():
    lengths = [10, 3, 7, 3, 2]
    groups = [[0], [2], [1, 3, 4]]  # padded sizes 10, 7, 9: only [1, 3, 4] has 2+ rows
    assert split_to(groups, lengths, 3) == groups
    assert split_to(groups, lengths, 4) == [[0], [2], [1, 3], [4]]
    assert split_to(groups, lengths, 5) == [[0], [2], [1], [3], [4]]
    with pytest.raises(ValueError, match="cannot split 5 micro-batches of single rows into 6"):
        split_to(groups, lengths, 6)
    # the larger of two splittable ones goes first: [0, 1] is 2 x 6, [2, 3] is 2 x 5
    assert split_to([[0, 1], [2, 3]], [6, 6, 5, 5], 3) == [[0], [1], [2, 3]]


def test_row_groups_are_consecutive():
    assert row_groups(5, 2) == [[0, 1], [2, 3], [4]]
    assert row_groups(5, 0) == [[0, 1, 2, 3, 4]]


def _rows(lengths: list[int], width: int) -> Batch:
    b = len(lengths)
    attn = torch.zeros(b, width, dtype=torch.long)
    for i, n in enumerate(lengths):
        attn[i, :n] = 1
    ids = torch.arange(b * width).reshape(b, width) % 31 + 1
    ids = ids * attn
    loss = attn[:, 1:].float()
    episode = torch.arange(b)
    return Batch(
        ids, attn, loss, -loss, loss.long() - 1, torch.zeros(1, b), torch.zeros(b), episode
    )


def test_plans_cover_every_row_once_and_trim_to_the_longest():
    rows = _rows([9, 2, 5, 5, 3, 12], width=12)
    tokens = plan_micro_batches(rows.attention_mask, 0, 16, world=1)
    assert [m.index.tolist() for m in tokens] == [[5], [0], [2, 3, 4], [1]]
    assert [m.width for m in tokens] == [12, 9, 5, 2]
    padded = plan_micro_batches(rows.attention_mask, 4, 0, world=1)
    assert [m.index.tolist() for m in padded] == [[0, 1, 2, 3], [4, 5]]
    assert {m.width for m in padded} == {12}
    for plan in (tokens, padded):
        assert sorted(i for m in plan for i in m.index.tolist()) == list(range(6))
    mb = tokens[2].batch(rows)  # 3 x 5 <= 16
    assert mb.input_ids.shape == (3, 5) and mb.loss_mask.shape == (3, 4)
    assert torch.equal(mb.input_ids, rows.input_ids[[2, 3, 4], :5])
    assert torch.equal(mb.rewards, rows.rewards)


def test_run_planned_scatters_back_to_the_rows_grid():
    rows = _rows([9, 2, 5, 5, 3, 12], width=12)

    def row_id_per_token(ids, attn, loss_mask):  # each output holds its row's first token id
        return ids[:, :1].float().expand(-1, ids.shape[1] - 1).clone()

    plan = plan_micro_batches(rows.attention_mask, 0, 16, world=1)
    out = run_planned(row_id_per_token, rows, plan)
    assert out.shape == rows.loss_mask.shape
    expected = rows.input_ids[:, :1].float().expand(-1, 11)
    lengths = rows.attention_mask.sum(-1)
    for i in range(6):  # real positions come back to their own row; trimmed columns are 0
        n = int(lengths[i]) - 1
        assert torch.equal(out[i, :n], expected[i, :n])
    assert torch.all(out[1, 1:] == 0)  # row 1 (2 tokens) ran alone, 2 columns wide


def test_trimming_keeps_the_real_tokens_outputs(tiny_model):
    """The premise of the bucketed path: with right padding, position ids of real tokens are
    their column indices whatever the width, and causal attention never reads a later padding
    column, so log-probs and entropies on real tokens are the same at the batch's width and at
    the micro-batch's (float64 weights, so only summation order could differ)."""
    torch.set_num_threads(1)
    model = build_policy(tiny_model).double()
    rows = _rows([9, 2, 5, 5, 3, 30], width=30)
    plan = plan_micro_batches(rows.attention_mask, 0, 16, world=1)
    assert max(m.width for m in plan[1:]) < 30  # the short rows do run trimmed
    with torch.no_grad():
        full_lp, full_h = token_logprobs(model, rows.input_ids, rows.attention_mask)
        for m in plan:
            lp, h = token_logprobs(model, m.inputs(rows.input_ids), m.inputs(rows.attention_mask))
            real = m.tokens(rows.attention_mask[:, 1:]) != 0
            torch.testing.assert_close(lp[real], m.tokens(full_lp)[real], rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(h[real], m.tokens(full_h)[real], rtol=1e-6, atol=1e-6)
            assert real.sum() > 0
