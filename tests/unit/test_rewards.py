"""Reward loading by spec, safe scoring, and the built-in math answer reward."""

from __future__ import annotations

import math

import pytest

from actors.rewards import (
    addition_reward,
    extract_final_answer,
    load_reward_fn,
    math_answer_reward,
    score,
)


def test_load_by_module_spec():
    assert load_reward_fn("actors.rewards:addition_reward") is addition_reward
    assert load_reward_fn("actors.rewards:math_answer_reward") is math_answer_reward


def test_load_by_file_path(tmp_path):
    f = tmp_path / "my_reward.py"
    f.write_text("def compute_score(prompt, completion, **fields):\n    return len(completion)\n")
    fn = load_reward_fn(f"{f}:compute_score")
    assert fn("p", "abc") == 3


@pytest.mark.parametrize("spec", ["", "actors.rewards", "actors.rewards:", ":fn", "m:not-an-id"])
def test_malformed_spec(spec):
    with pytest.raises(ValueError, match="malformed.*'package.module:function'"):
        load_reward_fn(spec)


def test_missing_module():
    with pytest.raises(ValueError, match=r"no_such_pkg_xyz:f.*cannot import module.*PYTHONPATH"):
        load_reward_fn("no_such_pkg_xyz:f")


def test_missing_file(tmp_path):
    spec = f"{tmp_path}/nope.py:f"
    with pytest.raises(ValueError, match=r"nope\.py.*not found.*fix the path"):
        load_reward_fn(spec)


def test_file_that_fails_to_import(tmp_path):
    f = tmp_path / "broken.py"
    f.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ValueError, match=r"importing .*broken\.py.* failed: RuntimeError: boom"):
        load_reward_fn(f"{f}:f")


def test_missing_attribute():
    with pytest.raises(ValueError, match=r"'actors.rewards' has no attribute 'nope'.*def nope"):
        load_reward_fn("actors.rewards:nope")


def test_not_callable():
    with pytest.raises(ValueError, match=r"ADDITION_PARTIAL_WEIGHT is a float, not callable"):
        load_reward_fn("actors.rewards:ADDITION_PARTIAL_WEIGHT")


def test_score_passes_fields_and_accepts_dicts():
    assert score(addition_reward, "7+5=", "12", {"answer": "12"}) == (1.0, "")
    assert score(lambda p, c, **f: {"score": 0.25, "extra": 1}, "p", "c", {}) == (0.25, "")
    assert score(lambda p, c, **f: 1, "p", "c", None) == (1.0, "")


def _raises(prompt, completion, **fields):
    raise KeyError("answer")


@pytest.mark.parametrize(
    ("fn", "reason"),
    [
        (_raises, "raised KeyError"),
        (lambda p, c, **f: math.nan, "not finite"),
        (lambda p, c, **f: {"score": math.inf}, "not finite"),
        (lambda p, c, **f: "1.0", "is str"),
        (lambda p, c, **f: None, "is NoneType"),
        (lambda p, c, **f: True, "is bool"),
        (lambda p, c, **f: {"reward": 1.0}, "no 'score' key"),
    ],
)
def test_score_never_raises(fn, reason):
    value, why = score(fn, "p", "c", {"answer": "1"})
    assert value == 0.0
    assert reason in why


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("so the answer is 42", "42", 1.0),
        ("first 3 then 41", "42", 0.0),  # the last number counts
        ("\\boxed{42} and then 7", "42", 1.0),  # boxed wins over later numbers
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),  # nested braces, text comparison
        ("total: 1,000", "1000", 1.0),
        ("it is 2.50", "2.5", 1.0),
        ("-3", "-3", 1.0),
        ("no numbers here", "1", 0.0),
        ("", "1", 0.0),
    ],
)
def test_math_answer_reward(completion, answer, expected):
    assert math_answer_reward("q", completion, answer=answer) == expected


def test_math_answer_reward_needs_an_answer():
    value, why = score(math_answer_reward, "q", "42", {})
    assert value == 0.0 and "answer" in why
    assert extract_final_answer("x \\boxed{ 7 } y") == "7"
