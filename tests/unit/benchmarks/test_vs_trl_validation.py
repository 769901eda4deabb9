"""``benchmarks/vs_trl/validation.py`` (the TRL side's validation) and the report's validation
figures, on literal inputs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.vs_trl.report import run_figures, val_figures
from benchmarks.vs_trl.validation import cut_at_stop, due, lengths_p95


def test_a_completion_ends_at_its_first_stop_token_which_it_keeps():
    assert cut_at_stop([5, 6, 2, 7, 2], {2}) == [5, 6, 2]
    assert cut_at_stop([5, 0, 2], {0, 2}) == [5, 0]
    assert cut_at_stop([5, 6], {2}) == [5, 6]  # truncated: no stop token


def test_p95_interpolates_as_the_learner_does():
    # torch.quantile, linear: position 0.95 * (n - 1) = 3.8 -> 4 + 0.8 * (100 - 4)
    assert lengths_p95([1, 2, 3, 4, 100]) == pytest.approx(80.8)
    assert lengths_p95([7]) == 7.0
    assert lengths_p95([]) != lengths_p95([])  # nan


@pytest.mark.parametrize(
    ("every", "at_start", "at_end", "steps", "want"),
    [
        (10, True, True, 30, [0, 10, 20, 30]),  # the end is also an interval: once
        (10, True, True, 25, [0, 10, 20, 25]),
        (10, False, False, 25, [10, 20]),
        (0, False, True, 3, [3]),
        (0, False, False, 3, []),
    ],
)
def test_validates_at_asyncrls_eval_steps(every, at_start, at_end, steps, want):
    schedule, got = SimpleNamespace(every=every, at_start=at_start, at_end=at_end), []
    for step, kw in [(0, {"start": True}), *((s, {}) for s in range(1, steps + 1)),
                     (steps, {"end": True})]:  # fmt: skip
        if step not in got and due(schedule, step, **kw):  # the callback skips a done step
            got.append(step)
    assert got == want


def test_val_figures_first_crossing_and_final():
    val = [{"step": 10, "t_proc_s": 50.0, "val/pass@1": 0.2, "val/seconds": 4.0},
           {"step": 0, "t_proc_s": 9.0, "val/pass@1": 0.125, "val/seconds": 2.0},
           {"step": 20, "t_proc_s": 90.0, "val/pass@1": 0.15, "val/seconds": 3.0}]  # fmt: skip
    fig = val_figures(val)
    assert fig["val_steps"] == [0, 10, 20]
    assert fig["val_pass1_initial"] == 0.125 and fig["val_pass1_final"] == 0.15
    assert fig["val_seconds_mean"] == pytest.approx(3.0)
    assert fig["time_to_val_pass1"]["0.1"] == {"t_proc_s": 9.0, "step": 0}
    assert fig["time_to_val_pass1"]["0.15"] == {"t_proc_s": 50.0, "step": 10}
    assert fig["time_to_val_pass1"]["0.25"] == {"t_proc_s": None, "step": None}
    assert val_figures([]) == {}
    timed_out = {"step": 30, "t_proc_s": 99.0, "val/pass@1": 0.9, "val/complete": 0.0}
    fig = val_figures([*val, timed_out])
    assert fig["val_steps"] == [0, 10, 20] and fig["val_incomplete"] == 1
    assert fig["time_to_val_pass1"]["0.25"]["step"] is None
    assert val_figures([timed_out]) == {"val_incomplete": 1}


def test_run_figures_carry_the_p95_length_and_validation():
    steps = [{"step": i, "t_train_s": i, "t_proc_s": i + 1.0, "reward": 0.5,
              "completion_tokens": 10.0, "completion_tokens_p95": p} for i, p in ((1, 20), (2, 40))]  # fmt: skip
    run = {
        "startup_s": 1.0,
        "steps": steps,
        "val": [{"step": 2, "t_proc_s": 4.0, "val/pass@1": 0.5}],
    }
    fig = run_figures(run, [0.4], window=1)
    assert fig["completion_tokens_p95_mean"] == 30.0 and fig["val_pass1_final"] == 0.5
    assert "val_pass1_final" not in run_figures({**run, "val": []}, [0.4], window=1)
