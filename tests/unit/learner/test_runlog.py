"""summary.json windows: reward_initial = first 10% of steps, reward_final = last 20%."""

import json

import pytest

from asyncrl.learner.hub.runlog import RunLog, window_mean


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


def _record(step: int, reward: float) -> dict:
    return {"step": step, "version": step + 1, "reward": reward, "staleness_max": 0,
            "staleness_mean": 0.0, "groups_per_s": 1.0, "tokens_per_s": 1.0, "dropped_stale": 0,
            "dropped_invalid": 0, "wall_s": float(step)}  # fmt: skip


def test_a_resumed_learner_summarises_the_whole_run(tmp_path):
    """Steps 0-9 logged, killed mid-write; resumed from the checkpoint at version 6, steps 6-9
    are trained again: the summary covers steps 0-9 once, with the replayed records."""
    first = RunLog(tmp_path, quiet=True)
    for i in range(10):
        first.log(_record(i, 0.0))
    first.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 10, "rew')  # torn by the kill
    resumed = RunLog(tmp_path, quiet=True)
    for i in range(6, 10):
        resumed.log(_record(i, 1.0))
    summary = resumed.write_summary({})
    resumed.close()
    assert [r["step"] for r in resumed.records] == list(range(10))
    assert summary["steps"] == 10
    assert summary["reward_initial"] == 0.0 and summary["reward_final"] == 1.0


def test_a_torn_last_line_does_not_swallow_the_next_record(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps(_record(0, 0.0)) + '\n{"step": 1, "rew')
    log = RunLog(tmp_path, quiet=True)
    log.log(_record(1, 0.5))
    log.close()
    again = RunLog(tmp_path, quiet=True)
    assert [r["step"] for r in again.records] == [0, 1]
    again.close()
