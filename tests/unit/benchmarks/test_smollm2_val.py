"""benchmarks/sync_vs_async/smollm2_val.py: the first validation at a threshold per seed, from both result
files' layouts (sync_vs_async's ``validation`` and vs_trl's ``runs[].val``)."""

from __future__ import annotations

import json

from benchmarks.sync_vs_async.smollm2_val import SVA, TRL, curves, time_to


def test_time_to_is_the_first_validation_at_the_threshold_per_seed():
    seeds = [[(100.0, 0.1), (200.0, 0.26), (300.0, 0.2)], [(90.0, 0.1), (180.0, 0.15)]]
    assert time_to(seeds, 0.25) == [200.0, None]
    assert time_to(seeds, 0.1) == [100.0, 90.0]


def test_curves_read_both_result_files(tmp_path):
    point = lambda t, p, measured=True: {"elapsed_s": t, "pass1": p, "measured": measured}  # noqa: E731
    sva = {
        "validation": {
            "arms": {
                "async_s4": {
                    "per_seed": [
                        {
                            "points": [
                                point(0.0, 0.125, False),
                                point(180.0, 0.1),
                                point(500.0, 0.25),
                            ]
                        }
                    ]
                }
            }
        }
    }
    trl = {"runs": [{"system": "trl", "val": [{"t_proc_s": 320.0, "val/pass@1": 0.14}]},
                    {"system": "asyncrl", "val": []}]}  # fmt: skip
    (tmp_path / SVA).write_text(json.dumps(sva))
    (tmp_path / TRL).write_text(json.dumps(trl))
    got = curves(tmp_path)
    assert got["async_s4"] == [[(180.0, 0.1), (500.0, 0.25)]]  # version 0 is not measured
    assert got["trl"] == [[(320.0, 0.14)]] and got["asyncrl_vs_trl_layout"] == [[]]
