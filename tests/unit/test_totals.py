"""learner/totals.py: a learner restarted from a checkpoint's totals ends with the totals of
one that never stopped."""

from __future__ import annotations

from dataclasses import dataclass, field

from learner.totals import RunTotals


@dataclass
class S:
    reward_error: str = ""


@dataclass
class G:
    group_id: str
    samples: list = field(default_factory=lambda: [S(), S("raised: boom")])
    num_tokens: int = 7


def _steps(t: RunTotals, steps) -> None:
    for i, stale in steps:
        t.count_trained([G(f"0:{i}"), G(f"0:{i + 100}")], stale)
        t.count_sync(1000, 0.5)
        t.count_sync_faults(i % 2, 1)


def test_restored_totals_continue_as_if_never_stopped():
    steps = [(0, [0, 1]), (1, [1, 1]), (2, [0, 2]), (3, [1, 0])]
    whole = RunTotals()
    _steps(whole, steps)
    first = RunTotals()
    _steps(first, steps[:2])
    saved = first.to_dict({"busy": 3.0}, 10.0, {"balanced": True})
    again = RunTotals()
    again.restore(saved)
    _steps(again, steps[2:])
    got = again.to_dict({"busy": 2.0, "checkpoint": 1.0}, 5.0, {})
    want = whole.to_dict({"busy": 5.0, "checkpoint": 1.0}, 15.0, {})
    assert got == want
    assert got["trained_totals"] == {"groups": 8, "samples": 16, "tokens": 56}
    assert got["trained_staleness_histogram"] == {"0": 3, "1": 4, "2": 1}
    assert got["weight_sync"]["count"] == 4 and got["weight_sync"]["failures"] == 2
    assert got["weight_sync"]["regroups"] == 4
    assert got["reward_errors"]["count"] == 8
