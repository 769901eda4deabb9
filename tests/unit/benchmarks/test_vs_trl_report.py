"""``benchmarks/vs_trl/report.py``: moving mean, time to threshold and ratios on literal runs."""

from __future__ import annotations

import pytest

from benchmarks.vs_trl.report import analyse, moving_mean, run_figures


def _run(system: str, seed: int, rewards: list[float], step_s: float, startup_s: float) -> dict:
    steps = [{"step": i + 1, "t_train_s": (i + 1) * step_s, "t_proc_s": startup_s + (i + 1) * step_s,
              "reward": r, "completion_tokens": 4.0} for i, r in enumerate(rewards)]  # fmt: skip
    return {"system": system, "seed": seed, "startup_s": startup_s, "steps": steps}


def test_moving_mean_is_defined_from_the_full_window_on():
    assert moving_mean([1.0, 0.0, 0.5, 0.5], 2) == [None, 0.5, 0.25, 0.5]
    assert moving_mean([0.3], 2) == [None]


def test_a_lucky_first_step_does_not_cross_the_threshold():
    run = _run("trl", 0, [0.9, 0.0, 0.0, 0.6, 0.6], step_s=2.0, startup_s=10.0)
    fig = run_figures(run, [0.5, 0.95], window=2)
    # windows: -, 0.45, 0.0, 0.3, 0.6 -> first >= 0.5 at step 5
    assert fig["time_to_threshold"]["0.5"] == {"with_startup_s": 20.0, "train_s": 10.0, "step": 5}
    assert fig["time_to_threshold"]["0.95"]["train_s"] is None
    assert fig["steps_per_s"] == pytest.approx(5 / 10.0)
    assert fig["steps_per_s_with_startup"] == pytest.approx(5 / 20.0)
    assert fig["reward_initial"] == pytest.approx(0.45) and fig["reward_final"] == pytest.approx(
        0.6
    )


def test_ratios_and_speedups_need_every_seed_to_reach():
    rewards = [0.2, 0.4, 0.6, 0.6]
    runs = [_run("trl", s, rewards, 2.0, 5.0) for s in (0, 1)]
    runs += [_run("asyncrl", 0, rewards, 1.0, 30.0), _run("asyncrl", 1, [0.0] * 4, 1.0, 30.0)]
    rep = analyse(runs, [0.5], window=2)
    cmp = rep["asyncrl_vs_trl"]
    assert cmp["steps_per_s_ratio"] == pytest.approx(2.0)
    assert rep["systems"]["asyncrl"]["time_to_threshold"]["0.5"]["reached"] == "1/2"
    assert cmp["time_to_threshold_speedup"]["0.5"] == {"with_startup_s": None, "train_s": None}
    assert "asyncrl in 1/2 seeds" in rep["verdicts"][1]
    runs[-1] = _run("asyncrl", 1, rewards, 1.0, 30.0)
    cmp = analyse(runs, [0.5], window=2)["asyncrl_vs_trl"]["time_to_threshold_speedup"]["0.5"]
    # first window >= 0.5 is step 3: TRL 6 s (11 s with start-up), asyncrl 3 s (33 s)
    assert cmp["train_s"] == pytest.approx(2.0)
    assert cmp["with_startup_s"] == pytest.approx(11.0 / 33.0)
