"""benchmarks/examples/report.py: an example run's figures from the files it wrote."""

import pytest

from benchmarks.examples.report import first_last, learning, markdown, rise, window_mean


def _records(rewards, rates):
    return [
        {
            "step": i,
            "version": i + 1,
            "reward": r,
            "episode/tool_call_rate": t,
            "elapsed_s": 10.0 * (i + 1),
        }
        for i, (r, t) in enumerate(zip(rewards, rates, strict=True))
    ]


def _val(version, reward, rate):
    return {"step": version + 1, "val/version": float(version), "val/reward": reward,
            "val/tool_call_rate": rate, "val/prompts": 48.0, "samples": [{"completion": "x"}]}  # fmt: skip


def test_window_means_take_the_first_tenth_and_the_last_fifth():
    values = [float(i) for i in range(10)]
    assert window_mean(values, 0.0, 0.1) == 0.0
    assert window_mean(values, 0.8, 1.0) == pytest.approx(8.5)
    assert window_mean([3.0], 0.8, 1.0) == 3.0 and window_mean([], 0.0, 0.1) is None


def test_learning_reports_the_rise_from_the_first_to_the_last_validation():
    records = _records([0.1] * 5 + [0.5] * 5, [0.4] * 5 + [0.9] * 5)
    val = [_val(0, 0.35, 0.8), _val(5, 0.30, 0.85), _val(10, 0.6, 0.97)]
    fig = learning(records, val, {"groups_trained": 80, "ledger": {"balanced": True}})
    assert [r["version"] for r in fig["validation"]] == [0, 5, 10]
    assert "samples" not in fig["validation"][0]
    assert fig["val_rise"]["val/reward"] == {"start": 0.35, "end": 0.6, "best": 0.6, "rose": True}
    assert fig["val_rise"]["val/pass@1"] is None  # not written by this run: said, not invented
    assert fig["train_first_last"]["reward"] == {"first": 0.1, "last": 0.5}
    assert fig["train_first_last"]["episode/tool_call_rate"]["last"] == pytest.approx(0.9)
    assert fig["wall_s"] == 100.0 and fig["steps"] == 10 and fig["ledger_balanced"] is True
    text = markdown("x", fig)
    assert "| 10 | 11 | 0.600 | 0.970 |" in text and "0.100 (first 10% of steps) -> 0.500" in text


def test_a_fall_is_reported_as_one():
    table = [{"val/reward": 0.4}, {"val/reward": 0.2}]
    assert rise(table, "val/reward")["rose"] is False
    assert rise(table[:1], "val/reward") is None
    assert first_last([{"reward": None}], "reward") is None
