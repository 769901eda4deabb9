"""actors/engine/completions.py ``_sampled_logprobs``: the sampled tokens' log-probs read from vLLM's
flat log-probs (``flat_logprobs=True``: the sampled token first at each position's start) or
from a list of ``{token: Logprob}`` dicts, and a clear error where they do not match the
sampled tokens. Fakes with vLLM's field names stand in; the real engine's log-probs are
checked against HF in tests/integration/test_weight_sync.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from asyncrl.actors.engine.completions import _sampled_logprobs


def _flat(positions: list[list[tuple[int, float]]]) -> SimpleNamespace:
    """vllm.logprobs.FlatLogprobs' layout: each position's (token, logprob) entries flat."""
    flat = SimpleNamespace(start_indices=[], end_indices=[], token_ids=[], logprobs=[])
    for entries in positions:
        flat.start_indices.append(len(flat.token_ids))
        for tok, lp in entries:
            flat.token_ids.append(tok)
            flat.logprobs.append(lp)
        flat.end_indices.append(len(flat.token_ids))
    return flat


def test_flat_logprobs_give_the_sampled_token_of_each_position():
    assert _sampled_logprobs(_flat([[(5, -0.5)], [(7, -1.25)]]), [5, 7]) == [-0.5, -1.25]


def test_flat_logprobs_with_top_k_entries_take_the_sampled_first_entry():
    lps = _flat([[(5, -2.0), (9, -0.1)], [(7, -0.3), (7, -0.3)]])  # sampled, then top-1
    assert _sampled_logprobs(lps, [5, 7]) == [-2.0, -0.3]


def test_an_empty_completion_has_no_logprobs():
    assert _sampled_logprobs(_flat([]), []) == []
    assert _sampled_logprobs(None, []) == []


@pytest.mark.parametrize(
    "positions, ids",
    [([[(5, -0.5)], [(8, -1.0)]], [5, 7]), ([[(5, -0.5)]], [5, 7])],
    ids=["another token", "a position missing"],
)
def test_flat_logprobs_that_do_not_match_the_tokens_raise(positions, ids):
    with pytest.raises(ValueError, match="do not match the sampled tokens"):
        _sampled_logprobs(_flat(positions), ids)


def test_a_list_of_dicts_is_read_by_token():
    lp = SimpleNamespace
    lps = [{5: lp(logprob=-0.5)}, {9: lp(logprob=-0.1), 7: lp(logprob=-1.5)}]
    assert _sampled_logprobs(lps, [5, 7]) == [-0.5, -1.5]
    with pytest.raises(ValueError, match="log-probs for 2 of 3 tokens"):
        _sampled_logprobs(lps, [5, 7, 1])
