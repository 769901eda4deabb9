"""core/types.py's ``Sample`` as an episode: a single-turn sample is a one-turn episode by
default, and every episode field is checked with a ValueError naming the field."""

from __future__ import annotations

import pytest

from asyncrl.core.types import EPISODE_ENDS, TRUNCATED_ENDS, Sample


def _sample(**episode) -> Sample:
    """A 2-turn-shaped sample: model tokens 4, 5, an environment token 9, model token 6."""
    return Sample([1, 2], [4, 5, 9, 6], [-0.5, -0.25, 0.0, -1.0], [2, 2, 2, 3], 1.0, **episode)


def test_defaults_make_a_one_turn_episode():
    s = _sample()
    assert s.loss_mask == [1, 1, 1, 1] and s.model_tokens == 4
    assert (s.turns, s.tool_calls, s.tool_errors, s.episode_end) == (1, 0, 0, "done")


def test_a_multi_turn_episode_counts_only_its_model_tokens():
    s = _sample(loss_mask=[1, 1, 0, 1], turns=2, tool_calls=1, tool_errors=1, episode_end="length")
    assert s.model_tokens == 3 and s.loss_mask == [1, 1, 0, 1]


def test_episode_ends():
    assert EPISODE_ENDS[0] == "done" and len(set(EPISODE_ENDS)) == len(EPISODE_ENDS)
    assert set(TRUNCATED_ENDS) == set(EPISODE_ENDS) - {"done"}


@pytest.mark.parametrize(
    ("episode", "reason"),
    [
        ({"loss_mask": [1, 1, 0]}, r"Sample\.loss_mask has 3 values but completion_ids 4"),
        ({"loss_mask": [1, 1, 0, 1, 1]}, r"Sample\.loss_mask has 5 values"),
        ({"loss_mask": [1, 2, 0, 1]}, r"Sample\.loss_mask values must be 0 or 1, got \[0, 1, 2\]"),
        ({"loss_mask": [1, -1, 0, 1]}, r"Sample\.loss_mask values must be 0 or 1"),
        ({"turns": 0}, r"Sample\.turns is 0, expected an int >= 1"),
        ({"turns": 1.5}, r"Sample\.turns is 1\.5"),
        ({"tool_calls": -1}, r"Sample\.tool_calls is -1, expected an int >= 0"),
        ({"tool_errors": -1}, r"Sample\.tool_errors is -1, expected an int >= 0"),
        (
            {"tool_calls": 1, "tool_errors": 2},
            r"Sample\.tool_errors \(2\) exceeds tool_calls \(1\)",
        ),
        ({"episode_end": "stop"}, r"Sample\.episode_end 'stop' not in \('done'"),
    ],
)
def test_each_bad_episode_field_is_named(episode: dict, reason: str):
    with pytest.raises(ValueError, match=reason):
        _sample(**episode)
