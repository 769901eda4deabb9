"""benchmarks/sync_vs_async/validation.py: validation points on two clocks, times to thresholds, the best
synchronous arm and the verdicts, on hand-made runs."""

from __future__ import annotations

import pytest

from benchmarks.sync_vs_async.validation import analyse_val, best_arms, markdown_val, val_points


def _run(arm: str, seed: int, vals: list[tuple[int, float, float]], step_s: float,
         sync: bool) -> dict:  # fmt: skip
    """``vals``: (version, pass@1, val seconds); one metrics record per version 1..10."""
    records = [{"version": v, "elapsed_s": v * step_s, "step_s": step_s,
                "response_len_mean": 40.0 + v,
                "response_len_p95": 100.0, "groups": 8} for v in range(1, 11)]  # fmt: skip
    val = [{"val/version": float(v), "val/pass@1": p, "val/reward": p,
            "val/response_length": 30.0, "val/seconds": s} for v, p, s in vals]  # fmt: skip
    mode = "mode=sync" if sync else "mode=async"
    return {"arm": arm, "seed": seed, "returncode": 0, "records": records, "val": val,
            "overrides": ["x=1", mode]}  # fmt: skip


def test_points_take_the_time_version_v_was_made_and_sync_subtracts_blocking_validations():
    r = _run("sync_split", 0, [(5, 0.2, 30.0), (10, 0.3, 20.0)], step_s=60.0, sync=True)
    pts = val_points(r, v0_pass1=0.125)
    assert [p["version"] for p in pts] == [0, 5, 10] and not pts[0]["measured"]
    assert [p["elapsed_s"] for p in pts] == [0.0, 300.0, 600.0]
    assert [p["train_s"] for p in pts] == [0.0, 300.0, 570.0]  # v5's 30 s validation blocked
    a = _run("async_s1", 0, [(5, 0.2, 30.0), (10, 0.3, 20.0)], step_s=60.0, sync=False)
    assert [p["train_s"] for p in val_points(a, None)] == [300.0, 600.0]  # overlapped


def test_verdict_compares_async_with_the_soonest_sync_arm_at_the_highest_common_threshold():
    runs = []
    for seed in (0, 1):
        runs.append(_run("sync_colocated", seed, [(5, 0.2, 10.0), (10, 0.3, 10.0)], 60.0, True))
        runs.append(_run("sync_split", seed, [(5, 0.25, 10.0), (10, 0.3, 10.0)], 80.0, True))
        runs.append(_run("async_s1", seed, [(5, 0.25, 10.0), (10, 0.3, 10.0)], 40.0, False))
        runs.append(_run("async_s4", seed, [(5, 0.1, 10.0), (10, 0.15, 10.0)], 30.0, False))
    arms = ["sync_colocated", "sync_split", "async_s1", "async_s4"]
    v = analyse_val(runs, arms, [0.2, 0.25, 0.3], v0_pass1=0.125)
    elapsed = v["verdicts"]["time_to"]
    assert elapsed["best_sync"] == "sync_colocated" and elapsed["threshold"] == 0.3
    assert elapsed["best_sync_s"] == 600.0
    s1 = elapsed["arms"]["async_s1"]
    assert s1["speedup"] == 1.5 and s1["met"] and s1["final_within_noise"]
    s4 = elapsed["arms"]["async_s4"]
    assert s4["speedup"] is None and not s4["met"] and not s4["final_within_noise"]
    assert v["arms"]["async_s4"]["time_to"]["0.2"]["reached"] == 0
    assert v["arms"]["sync_split"]["time_to"]["0.25"]["mean"] == 400.0
    assert v["arms"]["async_s1"]["completion_len_p95"]["mean"] == 100.0
    assert best_arms(runs, arms, [0.2, 0.25, 0.3], 0.125) == ["sync_colocated", "async_s1"]
    text = markdown_val(v)
    assert "1.50x (MET" in text and "not reached (NOT MET" in text


def test_no_verdict_when_no_sync_arm_reaches_a_threshold_in_every_seed():
    runs = [_run("sync_split", 0, [(10, 0.15, 1.0)], 60.0, True),
            _run("async_s1", 0, [(10, 0.3, 1.0)], 60.0, False)]  # fmt: skip
    v = analyse_val(runs, ["sync_split", "async_s1"], [0.2], v0_pass1=None)
    assert "note" in v["verdicts"]["time_to"]
    assert "no synchronous arm" in markdown_val(v)
    assert best_arms(runs, ["sync_split", "async_s1"], [0.2], None) == ["sync_split", "async_s1"]


def test_noise_is_the_validations_binomial_error_with_one_seed():
    """One seed each, 64 prompts: pass@1 0.30 against 0.25 is a difference of 0.05, well
    inside 2 x sqrt(0.3 x 0.7 / 64 + 0.25 x 0.75 / 64) = 0.158."""
    runs = [_run("sync_split", 0, [(10, 0.25, 1.0)], 60.0, True),
            _run("async_s1", 0, [(10, 0.30, 1.0)], 40.0, False)]  # fmt: skip
    for r in runs:
        for x in r["val"]:
            x["val/prompts"] = 64.0
    v = analyse_val(runs, ["sync_split", "async_s1"], [0.25], v0_pass1=None)
    x = v["verdicts"]["time_to"]["arms"]["async_s1"]
    assert x["noise"] == pytest.approx(2 * (0.3 * 0.7 / 64 + 0.25 * 0.75 / 64) ** 0.5)
    assert x["final_within_noise"] and x["speedup"] == 1.5
