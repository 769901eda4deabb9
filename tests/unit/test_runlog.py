"""summary.json windows: reward_initial = first 10% of steps, reward_final = last 20%."""

import json

import pytest

from asyncrl.runlog import RunLog, window_mean


@pytest.mark.parametrize(
    ("values", "lo", "hi", "expected"),
    [
        (list(range(10)), 0.0, 0.1, 0.0),
        (list(range(10)), 0.8, 1.0, 8.5),
        (list(range(100)), 0.0, 0.1, 4.5),
        ([3.0], 0.0, 0.1, 3.0),
        ([3.0], 0.8, 1.0, 3.0),
    ],
)
def test_window_mean(values, lo, hi, expected):
    assert window_mean(values, lo, hi) == pytest.approx(expected)


def test_summary_and_plot_written(tmp_path):
    log = RunLog(tmp_path, quiet=True)
    for i in range(20):
        log.log(
            {
                "step": i,
                "version": i + 1,
                "reward": i / 20,
                "staleness_max": i % 3,
                "staleness_mean": 0.5,
                "groups_per_s": 1.0,
                "tokens_per_s": 10.0,
                "dropped_stale": 0,
                "dropped_invalid": 0,
                "wall_s": float(i),
            }
        )
    summary = log.write_summary({"mode": "async"})
    log.close()
    assert summary["steps"] == 20
    assert summary["reward_initial"] == pytest.approx((0 + 0.05) / 2)
    assert summary["reward_final"] == pytest.approx(sum(i / 20 for i in range(16, 20)) / 4)
    assert summary["max_trained_staleness"] == 2
    assert json.loads((tmp_path / "summary.json").read_text())["mode"] == "async"
    assert (tmp_path / "reward.png").stat().st_size > 1000
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 20
