"""The built-in math reward: math-verify's equivalence first, the plain-number comparison
as the fallback, the last ``\\boxed{}`` (nested) as the answer; in the main thread (signal
timeouts) and in a worker thread (none)."""

from __future__ import annotations

import threading

import pytest

from asyncrl.actors.rewards.calls import score_call
from asyncrl.actors.rewards.loading import load_reward_fn, preflight
from asyncrl.actors.rewards.math_reward import extract_final_answer, math_reward

CASES = [
    # completion, reference, expected
    ("so \\boxed{\\frac{3}{4}}", "0.75", 1.0),  # fraction vs decimal
    ("\\boxed{\\frac{6}{8}}", "\\frac{3}{4}", 1.0),  # unreduced fraction
    ("\\boxed{2/3}", "\\frac{2}{3}", 1.0),
    ("\\boxed{\\frac{2}{3}}", "0.67", 0.0),  # close is not equal
    ("\\boxed{\\frac12}", "0.5", 1.0),  # brace-less \frac
    ("\\boxed{0.5}", "\\frac12", 1.0),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", 1.0),  # nested braces
    ("first \\boxed{1}, finally \\boxed{\\dfrac{1}{\\sqrt{4}}}", "1/2", 1.0),  # the last box
    ("\\boxed{5 \\text{ cm}}", "5", 1.0),  # units
    ("\\boxed{5\\,\\text{cm}}", "5", 1.0),
    ("\\boxed{5 cm}", "5", 1.0),
    ("\\boxed{6 \\text{ cm}}", "5", 0.0),
    ("the answer is 1,000", "1000", 1.0),  # no box: the last number, plain fallback
    ("it is 42.", 42, 1.0),  # a numeric reference
    ("no answer here", "5", 0.0),  # no answer
    ("\\boxed{}", "5", 0.0),  # an empty box
    ("\\boxed{x = 3}", "3", 1.0),
    ("\\boxed{3}", "4", 0.0),
]


@pytest.mark.parametrize(("completion", "truth", "expected"), CASES)
def test_math_reward(completion, truth, expected):
    assert math_reward("q", completion, ground_truth=truth) == expected


def test_ground_truth_wins_over_answer_and_none_is_an_error():
    # a dataset's raw 'answer' column may hold a worked solution; ground_truth is the answer
    assert math_reward("q", "\\boxed{7}", answer="so 3+4 = 7 #### 7", ground_truth="7") == 1.0
    assert math_reward("q", "\\boxed{7}", answer="7") == 1.0
    s = score_call(math_reward, "q", "\\boxed{7}", {})
    assert s.kind == "raised" and "needs a 'ground_truth' or 'answer' field" in s.reason


def test_plain_number_fallback_when_math_verify_cannot_parse():
    assert math_reward("q", "\\boxed{$1,000}", ground_truth="1000") == 1.0


def test_runs_in_a_worker_thread_without_signal_timeouts():
    """math-verify's default timeouts use signal.alarm and raise outside the main thread."""
    out = []
    t = threading.Thread(target=lambda: out.append(math_reward("q", "\\boxed{\\frac12}", "0.5")))
    t.start()
    t.join(30)
    assert out == [1.0]


def test_nested_boxed_extraction():
    assert extract_final_answer("\\boxed{\\frac{a}{\\sqrt{b}}} end") == "\\frac{a}{\\sqrt{b}}"
    assert extract_final_answer("\\boxed{\\boxed{2}}") == "2"  # the last box opened
    assert math_reward("q", "\\boxed{\\boxed{2}}", ground_truth="2") == 1.0
    assert extract_final_answer("\\boxed{unclosed 12") == "12"  # unbalanced: the last number


def test_loads_by_spec_and_preflight_finds_math_verify():
    fn = load_reward_fn("asyncrl.actors.rewards:math_reward")
    assert fn is math_reward
    preflight(fn)
