"""``benchmarks/sync_vs_async/run.py --tiny``: every figure the report needs is in the JSON.

A schema check on a few steps of the tiny preset, not a measurement: no number is asserted
beyond being present and well-formed. The actors use the simulated engine
(``actor.engine=sim``): the JSON's shape does not depend on the engine, and three vLLM engine
starts cost ~100 s of CI time (real vLLM runs: tests/e2e/test_run.py and the benchmarks).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e.conftest import REPO, needs_full_stack

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.redis]

ARMS = ["sync_colocated", "sync_split", "async_s1", "async_s1_mask_window"]
PER_RUN = {
    "time_to_target_s", "train_wall_s", "step_s_median", "trained_samples_per_s",
    "trained_tokens_per_s", "generated_tokens_per_s", "learner_idle_frac", "actor_idle_frac",
    "actor_time_s", "learner_time_s", "weight_sync_pause_learner_s",
    "weight_sync_pause_actor_s", "staleness_histogram", "dropped_stale", "groups_committed",
    "groups_trained", "reward_initial", "reward_final", "G_s", "T_s", "learner_cpu_per_work_s",
    "trained_token_frac", "length_bias", "tokens_masked_stale", "trained_generated_token_frac",
    "len_mean_read", "len_p95_read", "len_mean_trained", "len_p95_trained",
}  # fmt: skip


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    needs_full_stack()
    out = tmp_path_factory.mktemp("bench")
    cmd = [sys.executable, "-m", "benchmarks.sync_vs_async", "--tiny", "--arms", ",".join(ARMS),
           "--out", str(out), "--runs-dir", str(out / "runs"), "--name", "schema",
           "--set", "actor.engine=sim", "--stale-tokens", "drop_group", "mask",
           "--admission", "capacity", "window"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return out, json.loads((out / "schema.json").read_text()), proc.stdout


def test_provenance_and_config(result):
    _, doc, _ = result
    for key in ("name", "created", "command", "commit", "machine", "config"):
        assert doc[key], key
    m = doc["machine"]
    assert m["cores"] >= 2 and m["cpu"] and m["torch"] and m["vllm"]
    cfg = doc["config"]
    assert set(cfg["arms"]) == set(ARMS) and cfg["stale_tokens"] == ["drop_group", "mask"]
    assert cfg["admission"] == ["capacity", "window"]
    assert "algorithm.stale_tokens=mask" in cfg["arms"]["async_s1_mask_window"]
    assert "buffer.admission=window" in cfg["arms"]["async_s1_mask_window"]
    assert cfg["core_split"]["learner"] and cfg["core_split"]["actor"]
    assert not set(cfg["core_split"]["learner"]) & set(cfg["core_split"]["actor"])


def test_every_arm_has_every_figure(result):
    _, doc, _ = result
    assert set(doc["arms"]) == set(ARMS)
    for arm, a in doc["arms"].items():
        assert a["failed_seeds"] == [], arm
        assert len(a["per_seed"]) == 1
        run = a["per_seed"][0]
        assert not PER_RUN - set(run), arm
        assert 0 <= run["actor_idle_frac"] <= 1 and 0 <= run["learner_idle_frac"] <= 1
        if arm.startswith("sync"):  # one side always waits for the other there
            assert run["learner_idle_frac"] > 0 and run["actor_idle_frac"] > 0, arm
        assert sum(run["staleness_histogram"].values()) == run["groups_trained"]
        assert 0 < run["trained_token_frac"] <= 1 and run["length_bias"] > 0
        assert 0 < run["trained_generated_token_frac"] <= run["trained_token_frac"]
        assert run["len_p95_trained"] >= run["len_mean_trained"] > 0
        assert run["tokens_masked_stale"] == 0 or "_mask" in arm
        if "_window" in arm:  # it stops at the run's last read: every group made was read
            assert run["groups_committed"] == run["groups_trained"] + run["dropped_stale"]
        for key in ("trained_samples_per_s", "reward_final", "step_s_median"):
            assert set(a["mean"][key]) == {"mean", "std", "n"}
    sync = doc["arms"]["sync_split"]["staleness_histogram"]
    assert set(sync) == {"0"}, "max_staleness=0 trained a stale group"


def test_finished_runs_keep_their_records_and_not_their_checkpoints(result):
    """Each run wrote its end-of-run checkpoint (``learner.checkpoint_every=0``); the benchmark
    removed it once the run finished (``--keep-checkpoints`` keeps it) and kept what the report
    reads."""
    out, _, stdout = result
    runs = sorted((out / "runs" / "schema").glob("*-seed0"))
    assert [r.name for r in runs] == sorted(f"{a}-seed0" for a in ARMS)
    for run in runs:
        assert (run / "summary.json").is_file() and (run / "metrics.jsonl").is_file()
        assert not (run / "checkpoints").exists(), run
    assert "checkpoint" in (runs[0].parent / f"{runs[0].name}.log").read_text()


def test_overlap_bound_and_verdicts(result):
    _, doc, _ = result
    ov = doc["overlap"]
    assert ov["G_s"] > 0 and ov["T_s"] > 0
    run = doc["arms"]["sync_split"]["per_seed"][0]  # G and T are sync_split's, the bound theirs
    assert (ov["G_s"], ov["T_s"]) == (pytest.approx(run["G_s"]), pytest.approx(run["T_s"]))
    assert ov["bound"] == pytest.approx((run["G_s"] + run["T_s"]) / max(run["G_s"], run["T_s"]))
    # a synchronous step waits for generation, then trains: neither part exceeds the whole
    assert run["G_s"] < run["step_s_median"] and run["T_s"] < run["step_s_median"]
    assert ov["speedup_vs_sync_split"]["sync_split"]["throughput"] == pytest.approx(1.0)
    assert "async_s1" in ov["speedup_vs_sync_split"]
    assert doc["target_reward"] is not None
    assert any("async_s1" in v and "sync_colocated" in v for v in doc["verdicts"])


def test_plots_table_and_markdown_are_written(result):
    out, doc, stdout = result
    assert len(doc["plots"]) == 3
    for p in doc["plots"]:
        assert "/" not in p, p  # a name beside the JSON, no machine path
        with open(out / p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    table = (out / "schema.md").read_text()
    assert table == doc["table_markdown"] + "\n"
    for arm in ARMS:
        assert f"| {arm} |" in table and arm in stdout
    assert "(G+T)/max(G,T)" in table


def test_finished_only_reports_the_runs_there_and_lists_the_rest(result):
    """``--finished-only`` starts no run: the fixture's four arms are reported, and an arm
    and a seed never run (async_s2, seed 1) are listed as not run, within a few seconds."""
    out, _, _ = result
    cmd = [sys.executable, "-m", "benchmarks.sync_vs_async", "--tiny", "--finished-only",
           "--arms", ",".join([*ARMS, "async_s2"]), "--seeds", "0", "1", "--staleness", "1", "2",
           "--out", str(out / "again"), "--runs-dir", str(out / "runs"), "--name", "schema",
           "--set", "actor.engine=sim", "--stale-tokens", "drop_group", "mask",
           "--admission", "capacity", "window"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads((out / "again" / "schema.json").read_text())
    assert set(doc["arms"]) == set(ARMS)
    missing = {f"{a}-seed1" for a in ARMS} | {"async_s2-seed0", "async_s2-seed1"}
    assert set(doc["config"]["not_run"]) == missing
    assert "Not run yet" in doc["table_markdown"]
    assert not (out / "runs" / "schema" / "async_s2-seed0").exists()
