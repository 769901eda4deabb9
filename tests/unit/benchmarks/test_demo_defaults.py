"""``benchmarks/demo/defaults.py``'s pure parts: its arms differ in one choice each, and pin
explicitly (the config's default is ``auto``, so an arm that should be unpinned says so)."""

from __future__ import annotations

import json

import pytest

from benchmarks.demo import defaults as dd


def test_default_arms_pin_explicitly(monkeypatch):
    monkeypatch.setattr(dd.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    arms = dd.default_arms()
    assert list(arms) == ["r2_free", "r1_free", "r1_split", "r1_split_s2"]
    for name in ("r2_free", "r1_free"):
        assert "learner.cpu_affinity=''" in arms[name] and "actor.cpu_affinity=''" in arms[name]
    assert arms["r1_split"] == ["learner.nproc=1", "learner.cpu_affinity='0,1'",
                                "actor.cpu_affinity='2,3'"]  # fmt: skip
    assert arms["r1_split_s2"] == [*arms["r1_split"], "learner.sync_every=2"]


def test_parse_arm():
    assert dd.parse_arm("a:learner.nproc=1,seed=2") == ("a", ["learner.nproc=1", "seed=2"])
    assert dd.parse_arm("plain:") == ("plain", [])
    assert dd.parse_arm("before@HEAD~1:seed=3") == ("before@HEAD~1", ["seed=3"])  # its code
    with pytest.raises(SystemExit, match=r"expected NAME\[@REV\]:key=value"):
        dd.parse_arm("no-colon")


def test_learner_time_means_each_state(tmp_path):
    recs = [{"busy_s": 0.2, "waiting_data_s": 0.0, "weight_sync_s": 0.1, "cpu_s": 0.2},
            {"busy_s": 0.4, "waiting_data_s": 0.2, "weight_sync_s": 0.1, "cpu_s": 0.3}]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    got = dd._learner_time(tmp_path)
    assert got == pytest.approx({"learner_busy_s": 0.3, "learner_waiting_data_s": 0.1,
                                 "learner_weight_sync_s": 0.1, "learner_cpu_s": 0.25})  # fmt: skip
