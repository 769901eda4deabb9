"""Reward loading by spec, the signature check, safe scoring with error kinds, the actor's
reward scorer (worker thread, deadline, first-error logs, error rate), and the built-in math
answer reward."""

from __future__ import annotations

import asyncio
import functools
import math
import threading
import time

import pytest

from asyncrl.actors.data.addition import AdditionSource, addition_reward
from asyncrl.actors.rewards.calls import score
from asyncrl.actors.rewards.code_reward import python_code_reward
from asyncrl.actors.rewards.loading import check_signature, load_reward_fn
from asyncrl.actors.rewards.math_reward import extract_final_answer, math_answer_reward
from asyncrl.actors.rewards.sandbox import SandboxError
from asyncrl.actors.rewards.scoring import RewardErrorRate, RewardScorer
from asyncrl.core.config.job import TaskConfig
from asyncrl.core.runtime.error_window import ErrorWindow
from asyncrl.learner.hub.reward_records import REWARD_ERROR_KINDS, RewardErrorTally, error_kind


def test_load_by_module_spec():
    assert load_reward_fn("asyncrl.actors.data.addition:addition_reward") is addition_reward
    assert load_reward_fn("asyncrl.actors.rewards:math_answer_reward") is math_answer_reward


def test_load_by_file_path(tmp_path):
    f = tmp_path / "my_reward.py"
    f.write_text("def compute_score(prompt, completion, **fields):\n    return len(completion)\n")
    fn = load_reward_fn(f"{f}:compute_score")
    assert fn("p", "abc") == 3


@pytest.mark.parametrize(
    "spec", ["", "asyncrl.actors.rewards", "asyncrl.actors.rewards:", ":fn", "m:not-an-id"]
)
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


def test_a_reward_file_with_a_dataclass_and_postponed_annotations_loads(tmp_path):
    """dataclasses look their module up in sys.modules while the file runs: a file loaded
    without registering it failed with AttributeError ('NoneType' ... '__dict__')."""
    f = tmp_path / "typed.py"
    f.write_text(
        "from __future__ import annotations\nfrom dataclasses import dataclass\n\n"
        "@dataclass\nclass Weights:\n    exact: float = 1.0\n\n"
        "def score(prompt, completion, **fields):\n    return Weights().exact\n"
    )
    assert load_reward_fn(f"{f}:score")("p", "c") == 1.0


def test_missing_attribute():
    with pytest.raises(
        ValueError, match=r"'asyncrl.actors.rewards' has no attribute 'nope'.*def nope"
    ):
        load_reward_fn("asyncrl.actors.rewards:nope")


def test_not_callable():
    with pytest.raises(ValueError, match=r"ADDITION_PARTIAL_WEIGHT is a float, not callable"):
        load_reward_fn("asyncrl.actors.data.addition:ADDITION_PARTIAL_WEIGHT")


def test_score_passes_fields_and_accepts_dicts():
    assert score(addition_reward, "7+5=", "12", {"answer": "12"}) == (1.0, "")
    assert score(lambda p, c, **f: {"score": 0.25, "extra": 1}, "p", "c", {}) == (0.25, "")
    assert score(lambda p, c, **f: 1, "p", "c", None) == (1.0, "")


def _raises(prompt, completion, **fields):
    raise KeyError("answer")


@pytest.mark.parametrize(
    ("fn", "kind", "reason"),
    [
        (_raises, "raised", "raised KeyError"),
        (lambda p, c, **f: math.nan, "non_finite", "not finite"),
        (lambda p, c, **f: {"score": math.inf}, "non_finite", "not finite"),
        (lambda p, c, **f: -1e300, "out_of_range", "reward -1e+300 is beyond +-1e+06"),
        (lambda p, c, **f: {"score": 1e38}, "out_of_range", "beyond +-1e+06"),
        (lambda p, c, **f: "1.0", "wrong_type", "is str"),
        (lambda p, c, **f: None, "wrong_type", "is NoneType"),
        (lambda p, c, **f: True, "wrong_type", "is bool"),
        (lambda p, c, **f: {"reward": 1.0}, "missing_score", "no 'score' key"),
    ],
)
def test_score_never_raises(fn, kind, reason):
    value, why = score(fn, "p", "c", {"answer": "1"})
    assert value == 0.0
    assert reason in why
    assert why.startswith(f"{kind}: ") and error_kind(why) == kind


def test_error_kind_of_foreign_reasons():
    assert error_kind("") == ""
    assert error_kind("bad answer: 4") == "other"  # not written by score_call
    assert "timeout" in REWARD_ERROR_KINDS and error_kind("timeout: slow") == "timeout"


# -- the signature check (asyncrl run refuses a function that cannot be called) --------------

FIELDS = AdditionSource(0).get(0).fields  # the demo task's: a, b, answer


def _keyword_answer(prompt, completion, answer=None, **_):
    return 0.0


class _CallableReward:
    def __call__(self, prompt, completion, **fields):
        return 0.0


@pytest.mark.parametrize(
    "fn",
    [
        lambda prompt, completion, **fields: 0.0,
        lambda *args, **kwargs: 0.0,
        _keyword_answer,
        functools.partial(lambda scale, p, c, **f: scale, 1.0),
        _CallableReward(),
        addition_reward,
        math_answer_reward,
        python_code_reward,
    ],
    ids=[
        "canonical",
        "args-kwargs",
        "named-field",
        "partial",
        "callable",
        "addition",
        "math",
        "code",
    ],
)
def test_signatures_that_bind_are_accepted(fn):
    check_signature(fn, FIELDS, "m:f")


@pytest.mark.parametrize(
    ("fn", "why"),
    [
        (lambda prompt, completion: 0.0, "unexpected keyword argument 'a'"),
        (lambda prompt, completion, answer: 0.0, "unexpected keyword argument 'a'"),
        (lambda prompt, **fields: 0.0, "too many positional arguments"),
        (lambda *args: 0.0, "unexpected keyword argument 'a'"),
        (lambda p, c, extra, **fields: 0.0, "missing a required argument: 'extra'"),
    ],
    ids=["no-fields", "one-field-named", "one-positional", "args-only", "extra-required"],
)
def test_a_wrong_signature_is_refused_naming_the_expected_one(fn, why):
    with pytest.raises(ValueError) as err:
        check_signature(fn, FIELDS, "my_reward.py:f")
    message = str(err.value)
    assert "'my_reward.py:f'" in message and why in message
    assert "fn(prompt, completion, **fields)" in message
    assert "['a', 'answer', 'b']" in message  # the fields it would be called with


# -- the actor's scorer: a worker thread, a deadline, errors by kind, the error rate ---------


def _task(**kw) -> TaskConfig:
    """One thread calling the test's own function (the process pool: test_reward_pool.py)."""
    return TaskConfig(
        reward_fn="my_reward.py:f", **{"reward_executor": "thread", "reward_workers": 1, **kw}
    )


def _scorer(fn, lines: list[str] | None = None, kinds: list[str] | None = None, **kw):
    say = (lines if lines is not None else []).append
    count = (kinds if kinds is not None else []).append
    return RewardScorer(fn, _task(**kw), say, count)


def test_the_event_loop_runs_while_a_reward_is_running():
    """A reward that takes 0.3 s must not freeze the loop (weight updates, Ctrl-C)."""

    def slow(prompt, completion, **fields):
        time.sleep(0.3)
        return 1.0

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick = asyncio.create_task(ticker())
        scored = await _scorer(slow).score("p", "c", {})
        tick.cancel()
        return scored, ticks

    scored, ticks = asyncio.run(main())
    assert scored.value == 1.0 and not scored.kind
    assert ticks >= 10, f"the loop ran only {ticks} times in 0.3 s: the reward blocked it"


def test_a_call_past_the_deadline_is_a_timeout_and_the_next_call_is_not_stuck_behind_it():
    release = threading.Event()
    calls = []

    def stuck_once(prompt, completion, **fields):
        calls.append(prompt)
        if len(calls) == 1:
            release.wait(30)  # the test releases it at the end
        return 0.25

    lines: list[str] = []
    kinds: list[str] = []

    async def main():
        scorer = _scorer(stuck_once, lines, kinds, reward_timeout_s=0.2)
        t0 = time.monotonic()
        first = await scorer.score("p1", "c", {})
        t1 = time.monotonic()
        second = await scorer.score("p2", "c", {})
        return first, t1 - t0, second, time.monotonic() - t1

    try:
        first, first_s, second, second_s = asyncio.run(main())
    finally:
        release.set()
    assert first.kind == "timeout" and first.value == 0.0
    assert first.reason == "timeout: the call took longer than task.reward_timeout_s=0.2 s"
    assert 0.2 <= first_s < 1.0
    assert second.value == 0.25 and second_s < 0.5, "the next call waited for the stuck one"
    assert kinds == ["timeout"]
    # the log shows where the stuck call was
    assert any("in stuck_once" in line for line in lines), lines
    assert any("release.wait(30)" in line for line in lines), lines


def test_a_stop_does_not_wait_for_a_stuck_call():
    release = threading.Event()

    async def main():
        scorer = _scorer(lambda p, c, **f: release.wait(30) and 1.0)
        task = asyncio.create_task(scorer.score("p", "c", {}))
        await asyncio.sleep(0.1)
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - t0

    try:
        assert asyncio.run(main()) < 0.5
    finally:
        release.set()


def test_the_first_error_of_each_kind_is_logged_once_with_its_traceback():
    turns = iter([0, 1, 0, 2, 1])

    def fails(prompt, completion, **fields):
        turn = next(turns)
        if turn == 0:
            raise ZeroDivisionError("boom")
        return "x" if turn == 1 else math.nan

    lines: list[str] = []
    kinds: list[str] = []

    async def main():
        scorer = _scorer(fails, lines, kinds)
        return [await scorer.score("12+3=", "c", {}) for _ in range(5)]

    results = asyncio.run(main())
    assert [r.kind for r in results] == [
        "raised",
        "wrong_type",
        "raised",
        "non_finite",
        "wrong_type",
    ]
    assert kinds == [r.kind for r in results]
    headers = [line for line in lines if line.startswith("reward error")]
    assert [h.split(")")[0] for h in headers] == [
        "reward error (raised",
        "reward error (wrong_type",
        "reward error (non_finite",
    ]
    assert "task.reward_fn=my_reward.py:f" in headers[0] and "'12+3='" in headers[0]
    body = [line for line in lines if line.startswith("| ")]
    assert "| Traceback (most recent call last):" in body
    assert any("in fails" in line for line in body)
    assert "| ZeroDivisionError: boom" in body
    assert any("returned 'x'" in line for line in body)
    assert any("returned nan" in line for line in body)


def test_too_many_recent_errors_fail_naming_function_fraction_first_error_and_key():
    calls = []

    def raises(prompt, completion, **fields):
        calls.append(prompt)
        raise KeyError("answer")

    async def main():
        scorer = _scorer(raises, max_reward_error_frac=0.5, reward_error_window=4)
        results = [await scorer.score("p", "c", {}) for _ in range(2)]  # 2 of 4: not > 0.5
        with pytest.raises(RewardErrorRate) as err:
            await scorer.score("p", "c", {})
        with pytest.raises(RewardErrorRate):  # and no more calls once it tripped
            await scorer.score("p", "c", {})
        return results, str(err.value)

    results, message = asyncio.run(main())
    assert [r.kind for r in results] == ["raised", "raised"] and len(calls) == 3
    assert "task.reward_fn=my_reward.py:f failed on 3 of the last 4 rewards (75%" in message
    assert "task.max_reward_error_frac=0.5" in message
    assert "first error: raised: reward function raised KeyError: 'answer'" in message
    assert "1.0 = never fail" in message


def test_a_reward_whose_first_calls_all_fail_the_same_way_fails_fast():
    """Issue 43 round 4: a reward that always hangs needed 129 timeouts (about 32 minutes at
    the defaults) before the run failed. Now 16 first calls that all fail one way stop it;
    mixed kinds, or one success among them, leave it to the window."""
    import threading

    release = threading.Event()

    def hangs(prompt, completion, **fields):
        release.wait(5)  # a thread worker is abandoned at its timeout, not killed
        return 1.0

    async def main():
        scorer = _scorer(hangs, reward_timeout_s=0.05, reward_workers=4)
        try:
            results = await asyncio.gather(*(scorer.score("p", "c", {}) for _ in range(15)))
            with pytest.raises(RewardErrorRate) as err:
                await scorer.score("p", "c", {})
            return results, str(err.value)
        finally:
            release.set()
            scorer.close()

    results, message = asyncio.run(main())
    assert [r.kind for r in results] == ["timeout"] * 15
    assert message.startswith(
        "reward function task.reward_fn=my_reward.py:f failed on each of the first 16 rewards, "
        "all the same way (timeout): timeout: the call took longer than "
        "task.reward_timeout_s=0.05 s."
    ), message
    assert "raise task.reward_timeout_s" in message and "max_reward_error_frac=1.0" in message


@pytest.mark.parametrize(
    ("results", "tripped_at"),
    [
        (["raised"] * 16, 16),
        (["raised"] * 15 + ["timeout"], None),  # two kinds: the window decides (16 of 256)
        ([""] + ["raised"] * 20, None),  # one success first
    ],
)
def test_error_window_fails_fast_only_on_first_results_of_one_kind(results, tripped_at):
    window = ErrorWindow(0.5, 256)
    tripped = [window.add(bool(k), k) for k in results]
    assert tripped.index(True) + 1 == tripped_at if tripped_at else not any(tripped)
    assert window.fast == bool(tripped_at)
    tolerant = ErrorWindow(0.9, 256)  # a user who tolerates more keeps the window alone
    assert not any(tolerant.add(bool(k), k) for k in results)


def test_max_reward_error_frac_1_never_fails():
    async def main():
        scorer = _scorer(_raises, max_reward_error_frac=1.0, reward_error_window=4)
        return [await scorer.score("p", "c", {}) for _ in range(20)]

    assert all(r.kind == "raised" for r in asyncio.run(main()))


def test_a_machine_that_cannot_sandbox_fails_the_actor_not_the_sample():
    def no_sandbox(prompt, completion, **fields):
        raise SandboxError("no landlock")

    with pytest.raises(SandboxError, match="no landlock"):
        asyncio.run(_scorer(no_sandbox).score("p", "c", {}))


@pytest.mark.parametrize(
    ("frac", "size", "results", "tripped"),
    [
        (0.5, 4, [0, 1, 1, 0, 1], [False, False, False, False, True]),  # 3 of the last 4
        (0.5, 10, [1] * 6, [False] * 5 + [True]),  # unseen ones count as successes: 6 > 5
        (0.5, 2, [1, 0, 1, 1], [False, False, False, True]),  # errors leave the window
        (1.0, 3, [1] * 5, [False] * 5),  # 1.0 never trips
        (0.0, 5, [0, 0, 1], [False, False, True]),  # 0.0 trips on the first error
    ],
)
def test_error_window(frac, size, results, tripped):
    window = ErrorWindow(frac, size)
    assert [window.add(bool(r)) for r in results] == tripped


@pytest.mark.parametrize(("frac", "size"), [(-0.1, 4), (1.1, 4), (0.5, 0)])
def test_error_window_refuses_bad_arguments(frac, size):
    with pytest.raises(ValueError, match="need 0 <= frac <= 1 and size >= 1"):
        ErrorWindow(frac, size)


def test_tally_counts_by_kind_keeps_the_first_and_survives_a_round_trip():
    tally = RewardErrorTally()
    reasons = ["", "wrong_type: reward is str", "raised: boom", "old actor's reason", "raised: x"]
    for i, reason in enumerate(reasons):
        tally.add(reason, f"0:{i}")
    expected = {
        "count": 4,
        "samples": 5,
        "by_kind": {"other": 1, "raised": 2, "wrong_type": 1},
        "first": {"kind": "wrong_type", "reason": "wrong_type: reward is str", "group_id": "0:1"},
    }
    assert tally.to_dict() == expected
    assert RewardErrorTally(tally.to_dict()).to_dict() == expected
    empty = {"count": 0, "samples": 0, "by_kind": {}, "first": None}
    assert RewardErrorTally(None).to_dict() == empty


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
