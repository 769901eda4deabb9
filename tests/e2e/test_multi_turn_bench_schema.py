"""``python -m benchmarks.multi_turn`` on a tiny run: the JSON has every figure the report
needs, and the slow environment's delays are what the benchmark says.

A schema check, not a measurement: the calibration arm and two contestants (``sync_split``,
``async_s1_window``), one seed, 2 steps of 4 groups, delays of median 0.05 s and p99 0.2 s,
validation of 8 prompts; no number is asserted beyond being present and well-formed. The
actors use the simulated engine (``actor.engine=sim``, as tests/e2e/test_benchmark_schema.py):
the JSON's shape does not depend on the engine, and three vLLM starts would double the time
(~55 s here with it; the real engine runs in tests/e2e/test_multi_turn_run.py).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from benchmarks.common import read_result
from benchmarks.multi_turn import slow_env
from tests.e2e.conftest import REPO, needs_full_stack


def stack(test):
    """The marks of a test that runs the whole stack (the fixture's runs)."""
    return pytest.mark.slow(pytest.mark.vllm(pytest.mark.redis(test)))


ARMS = ["sync_split", "async_s1_window"]
THRESHOLDS = [0.1, 0.2]
PER_RUN = {
    "seed", "steps", "time_to_target_s", "train_wall_s", "step_s_median", "wait_s", "work_s",
    "episodes_trained_per_s", "episodes_generated_per_s", "actor_idle_frac", "actor_time_s",
    "engine_busy_frac_est", "actor_waiting_env_frac", "learner_idle_frac", "env_s_per_episode", "env_steps_per_episode",
    "token_staleness_histogram", "token_staleness_mean", "staleness_histogram", "length_bias",
    "dropped_stale", "groups_trained", "episode_ends", "reward_initial", "reward_final",
    "trained_token_frac", "weight_sync_pause_learner_s",
}  # fmt: skip


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    needs_full_stack()
    out = tmp_path_factory.mktemp("multi_turn")
    cmd = [sys.executable, "-m", "benchmarks.multi_turn", "--arms", ",".join(ARMS),
           "--admission", "capacity", "window", "--seeds", "0", "--steps", "2",
           "--calibration-steps", "2", "--latency-median-s", "0.05", "--latency-p99-s", "0.2",
           "--thresholds", *map(str, THRESHOLDS), "--out", str(out),
           "--runs-dir", str(out / "runs"), "--name", "schema", "--set", "actor.engine=sim",
           "--set", "model.sft_steps=50", "--set", "learner.batch_groups=4",
           "--set", "eval.max_prompts=8"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return out, read_result(out / "schema.json"), proc.stdout  # with its per-step traces


def test_delays_are_lognormal_deterministic_and_capped():
    """The environment's delays: the stated median and p99, the same for the same key in any
    process, capped; the ``n`` episodes of one row draw their own (``row["episode"]``)."""
    env = {slow_env.MEDIAN_VAR: "1", slow_env.P99_VAR: "20", slow_env.SEED_VAR: "3"}
    p = slow_env.latency_params(env)
    assert p["cap_s"] == 60 and p["sigma"] == pytest.approx(1.2877, abs=1e-3)
    draws = sorted(slow_env.delay_s(p, f"k{i}") for i in range(20000))
    assert draws[10000] == pytest.approx(1.0, rel=0.05) and draws[19800] == pytest.approx(
        20, rel=0.15
    )
    assert max(draws) <= 60 and slow_env.delay_s(p, "k7") == slow_env.delay_s(dict(p), "k7")
    assert slow_env.delay_s({**p, "seed": 4}, "k7") != slow_env.delay_s(p, "k7")

    async def keys():  # a row names its group and which of the n episodes it is
        out = []
        for j in range(3):
            e = slow_env.SlowChain()
            row = {"a": 1, "b": 2, "answer": "3", "prompt": "1+2=", "group_id": "0:5", "episode": j}
            await e.reset(row)
            out.append(e._key)
        return out

    k = asyncio.run(keys())
    assert len(set(k)) == 3 and k == asyncio.run(keys())


@stack
def test_provenance_and_config(result):
    _, doc, _ = result
    for key in ("name", "created", "command", "commit", "machine", "config"):
        assert doc[key], key
    assert doc["command"].startswith("python -m benchmarks.multi_turn --arms")
    assert str(REPO) not in doc["command"] and "--out PATH" in doc["command"]
    m = doc["machine"]
    assert m["cores"] >= 2 and m["cpu"] and m["torch"] and m["vllm"]
    cfg = doc["config"]
    lat = cfg["latency"]
    assert (lat["median_s"], lat["p99_s"]) == (0.05, 0.2) and lat["cap_s"] == pytest.approx(0.6)
    assert lat["env_vars"][slow_env.P99_VAR] == "0.2" and lat["sigma"] > 0
    assert cfg["env_timeout_s"] > lat["cap_s"]
    common = cfg["common_overrides"]
    assert f"episode.env={slow_env.__name__}:SlowChain" in common
    assert "episode.env_workers=1" in common and "experiment=chain" in common
    assert f"episode.env_timeout_s={cfg['env_timeout_s']:g}" in common
    assert list(cfg["arms"]) == ARMS and "mode=sync" in cfg["arms"]["sync_split"]
    assert "buffer.admission=window" in cfg["arms"]["async_s1_window"]
    assert cfg["calibration"]["steps"] == 2 and cfg["shape"]["batch_groups"] == 4
    assert cfg["trl"]["run"] is False and "tool" in cfg["trl"]["why"]


@stack
def test_every_arm_has_every_figure(result):
    _, doc, _ = result
    assert set(doc["arms"]) == set(ARMS)
    for arm, a in doc["arms"].items():
        assert a["failed_seeds"] == [] and len(a["per_seed"]) == 1, arm
        run = a["per_seed"][0]
        assert not PER_RUN - set(run), (arm, PER_RUN - set(run))
        assert run["steps"] == 2 and run["episodes_trained_per_s"] > 0
        assert 0 <= run["actor_idle_frac"] <= 1 and run["engine_busy_frac_est"] > 0
        # the environment's delays (median 0.05 s) left the engine with nothing to do a while
        assert 0 < run["actor_waiting_env_frac"] < 1
        assert sum(run["staleness_histogram"].values()) == run["groups_trained"]
        assert sum(run["token_staleness_histogram"].values()) > 0
        assert sum(run["episode_ends"].values()) == run["groups_trained"] * 8
        assert run["env_s_per_episode"] > 0 and 0 < run["env_steps_per_episode"] <= 2
        assert set(a["mean"]["step_s_median"]) == {"mean", "std", "n"}
    assert set(doc["arms"]["sync_split"]["token_staleness_histogram"]) == {"0"}


@stack
def test_calibration_overlap_bound_and_validation(result):
    _, doc, _ = result
    assert doc["calibration"]["arm"] == "sync_split_nolat" and doc["calibration"]["G_s"] > 0
    calib = next(r for r in doc["runs"] if r["arm"] == "sync_split_nolat")
    assert calib["env"][slow_env.MEDIAN_VAR] == "0.0" and not calib["val"]
    ov = doc["overlap"]
    for key in ("G_s", "W_s", "T_s", "E_s", "R_s", "bound", "env_s_per_episode"):
        assert ov[key] is not None, key
    assert ov["bound"] >= 1 and ov["arms"]["sync_split"]["speedup_steps_per_s"] == 1
    s1 = ov["arms"]["async_s1_window"]
    assert s1["inflight_cap_groups"] == 4 and 0 < s1["bound_k"] <= ov["bound"] + 1e-9
    val = doc["validation"]
    assert val["metric"] == "val/reward" and val["thresholds"] == THRESHOLDS
    for arm in ARMS:
        f = val["arms"][arm]["per_seed"][0]
        assert [p["version"] for p in f["points"]][0] == 0 and f["points"][0]["elapsed_s"] == 0
        assert f["final_version"] == 2 and f["final"] is not None
        assert set(f["time_to"]) == {str(t) for t in THRESHOLDS}
    verdict = val["verdicts"]
    assert verdict["best_sync"] == "sync_split" and set(verdict["arms"]) == {"async_s1_window"}
    assert set(verdict["arms"]["async_s1_window"]["met"]) == {"elapsed_s", "train_s"}
    assert doc["verdicts"]


@stack
def test_plots_table_and_records_are_written(result):
    out, doc, stdout = result
    assert len(doc["plots"]) == 3
    for p in doc["plots"]:
        assert "/" not in p, p  # a name beside the JSON, no machine path
        assert (out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "schema.md").read_text() == doc["table_markdown"] + "\n"
    for arm in ARMS:
        assert f"| {arm} |" in doc["table_markdown"] and arm in stdout
    assert (out / "schema.records.json.gz").is_file()
    assert json.loads((out / "schema.json").read_text())["records_file"]
    for r in doc["runs"]:  # the traces are back, the paths relative
        assert r["records"] and not r["run_dir"].startswith("/")
        assert "reward/env_delay_s" in r["records"][-1]
