"""scripts/gpu_check.sh's dry run: every part of the prepared GPU check runs on the CPU at the
tiny shape, with the packages a bare GPU machine lacks refused (``--block-imports``), and
writes the summary and the files the GPU run commits. On a CPU machine the GPU tests skip
(each with its reason); on a GPU machine this test would run them for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import gpu_check  # noqa: E402

pytestmark = pytest.mark.slow


def test_the_dry_run_runs_every_part_without_the_packages_a_gpu_machine_lacks(tmp_path):
    out, copy = tmp_path / "gpu", tmp_path / "copied"
    out.mkdir()
    (out / "old_rerun.json").write_text("{}")  # an earlier run's file: not copied again
    os.utime(out / "old_rerun.json", (0, 0))
    cmd = ["bash", "scripts/gpu_check.sh", "--dry-run", "--block-imports",
           "--out", str(out), "--copy-to", str(copy)]  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": str(tmp_path)}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=400, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    parts = summary["parts"]
    assert list(parts) == ["env", "tests_gpu", "weight_path", "learner_throughput"]
    assert all(p["status"] == "ok" for p in parts.values()), parts
    assert summary["env"]["torch"] and summary["env"]["cuda_available"] is False
    gpu_tests = parts["tests_gpu"]
    assert gpu_tests["counts"]["failed"] == 0 and gpu_tests["counts"]["skipped"] >= 8
    assert all("needs a CUDA GPU" in why for why in gpu_tests["skipped"].values())
    assert set(parts["weight_path"]["gb_per_s"]) == {"host_stream", "device_stream",
                                                     "d2h_pageable", "d2h_pinned"}  # fmt: skip
    arms = parts["learner_throughput"]["arms"]
    assert set(arms) == {"asyncrl", "bare", "bucketed", "lora16"}  # and "compiled" on a GPU
    assert arms["asyncrl"]["vs_ref"]["same_dtype_threads_cores"]
    assert all(a["status"] == "ok" and a["real_tokens_per_s"] > 0 for a in arms.values())
    assert arms["asyncrl"]["largest_groups"] >= 2 and arms["bare"]["largest_groups"] is None
    throughput = json.loads((out / "learner_throughput.json").read_text())
    assert "partial" not in throughput and throughput["config"]["fit"]["arms"] == ["asyncrl"]
    profile = arms["asyncrl"]["profile"]  # one more step under torch.profiler, its tables
    assert profile["path"] == "learner_throughput_asyncrl_profile.txt" and profile["wall_s"] > 0
    assert "by self_cpu_time_total" in (out / profile["path"]).read_text()
    assert arms["bare"]["profile"] is None
    for name in ("summary.json", "tests_gpu.xml", "weight_path.json", "learner_throughput.json",
                 "gpu_check.log", profile["path"]):  # fmt: skip
        assert (copy / name).is_file(), name
    assert not (copy / "old_rerun.json").exists()
    assert "gpu_check --block-imports" in (REPO / "scripts" / "gpu_check.py").read_text()


def test_a_part_past_its_deadline_is_killed_and_recorded(tmp_path):
    args = Namespace(out=str(tmp_path), copy_to=None, budget_s=60, block_imports=True,
                     dry_run=True)  # fmt: skip
    check = gpu_check.Check(args)
    t0 = time.monotonic()
    res = check.run("slow", ["bash", "-c", "echo started; sleep 30"], budget=2)
    assert time.monotonic() - t0 < 10
    assert res["status"] == "timeout" and "started" in (tmp_path / "gpu_check.log").read_text()
    probe = "import importlib.util as u; print(u.find_spec('vllm'), u.find_spec('redis'))"
    res = check.run("blocked", [sys.executable, "-c", probe], budget=30)
    assert res["status"] == "ok" and "None None" in (tmp_path / "gpu_check.log").read_text()


def test_junit_counts_reads_passes_failures_and_skips(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="a" name="ok"/>'
                   '<testcase classname="a" name="bad"><failure message="boom"/></testcase>'
                   '<testcase classname="a" name="skip"><skipped message="no GPU"/></testcase>'
                   "</testsuite></testsuites>")  # fmt: skip
    got = gpu_check.junit_counts(xml)
    assert got["counts"] == {"passed": 1, "failed": 1, "skipped": 1}
    assert got["failed"] == {"a::bad": "boom"} and got["skipped"] == {"a::skip": "no GPU"}
    assert "error" in gpu_check.junit_counts(tmp_path / "missing.xml")
    stale = gpu_check.junit_counts(xml, since=time.time() + 60)  # an earlier run's file
    assert stale == {"error": "r.xml was not written by this run (the file is an earlier run's)"}
