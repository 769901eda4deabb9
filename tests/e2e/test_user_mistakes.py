"""Mistakes a person makes and faults a machine causes outside the role code:
model directories that cannot be loaded, run directories that cannot be written, a full disk
under a role's log, `asyncrl status` on a job that has ended or a directory that does not
exist. Each gives one clear message (no traceback) and loses nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SIM = ("actor.engine=sim", "experiment=tiny", "metrics_port=0", "learner.nproc=1")


def asyncrl(*args: str, env: dict | None = None, timeout: float = 120):
    return subprocess.run(
        [sys.executable, "-m", "asyncrl.orchestration.cli", *args], cwd=REPO, capture_output=True, text=True,
        timeout=timeout, env={**os.environ, **(env or {})},
    )  # fmt: skip


def _refused(res, *needles: str) -> str:
    out = res.stdout + res.stderr
    assert res.returncode == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    for needle in needles:
        assert needle in out, out[-3000:]
    return out


@pytest.mark.redis
def test_a_corrupt_model_config_is_named_before_anything_starts(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"vocab_size": 32, ')  # cut short
    res = asyncrl("run", *SIM, f"model.path={model}", f"run_dir={tmp_path / 'run'}")
    _refused(res, f"{model / 'config.json'} cannot be read as JSON")
    assert not (tmp_path / "run" / "redis").exists(), "a buffer was started for a bad model"


@pytest.mark.redis
def test_a_model_directory_without_weights_is_named_before_anything_starts(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 32}))
    res = asyncrl("run", *SIM, f"model.path={model}", f"run_dir={tmp_path / 'run'}")
    _refused(res, f"model.path='{model}' has no weights", "*.safetensors")


@pytest.mark.parametrize("where", ["under_a_file", "in_proc"])
def test_an_unusable_run_dir_is_named(tmp_path, where):
    if where == "under_a_file":
        (tmp_path / "file").write_text("x")
        run_dir = tmp_path / "file" / "run"
    else:
        run_dir = Path("/proc/asyncrl-no-such-dir/run")
    res = asyncrl("run", *SIM, f"run_dir={run_dir}")
    _refused(res, f"run_dir={run_dir} is not usable", "give a writable directory")


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_full_disk_under_a_role_log_still_shows_why_the_role_failed(tmp_path):
    """The learner's log is /dev/full (every write: ENOSPC) and the learner crashes at its
    second step: the launcher says the log cannot be written and still shows the crash."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "learner.log").symlink_to("/dev/full")
    res = asyncrl(
        "run", *SIM, "learner.steps=50", f"run_dir={run_dir}",
        env={"ASYNCRL_FAILPOINTS": "learner.after_step=raise@2"}, timeout=240,
    )  # fmt: skip
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert f"cannot write {run_dir / 'learner.log'}: no space left on the device" in out, out
    failed = out[out.index("[asyncrl] FAILED") :]
    assert "its last output (not in" in failed, failed
    assert "FailpointError" in failed, failed  # the tail came from memory


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(200)
def test_status_of_an_ended_job_shows_its_summary_and_of_a_missing_dir_says_so(tmp_path):
    run_dir = tmp_path / "run"
    res = asyncrl("run", *SIM, f"run_dir={run_dir}", timeout=180)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    status = asyncrl("status", f"run_dir={run_dir}", timeout=20)
    assert status.returncode == 0, status.stderr
    assert f"the job in {run_dir} has ended" in status.stdout, status.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert f"groups_trained: {summary['groups_trained']}" in status.stdout, status.stdout

    missing = asyncrl("status", f"run_dir={tmp_path / 'nope'}", timeout=20)
    _refused(missing, f"run_dir={tmp_path / 'nope'} does not exist")


@pytest.mark.redis
def test_a_real_model_path_under_the_demo_preset_is_warned_with_the_fix(tmp_path):
    """``model.path=X`` without ``model=local`` keeps the demo's lr and 8-token answers: the
    run says so, naming model=local, before the model is checked (this fake model is then
    refused: it has no tokenizer)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 32}))
    (model / "model.safetensors").write_bytes(b"never read: the run stops at its data")
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    res = asyncrl("run", *SIM, f"model.path={model}", "task=file", f"data.train_files=[{data}]",
                  f"run_dir={tmp_path / 'run'}")  # fmt: skip
    out = res.stdout + res.stderr
    assert res.returncode == 1, out[-3000:]
    assert "[asyncrl] warning: learner.lr=0.0002 is far above" in out, out[-3000:]
    assert "model=local model.path=..." in out and "warning: sampling.max_tokens=8" in out
    assert "has no tokenizer (tokenizer.json" in out and "Traceback" not in out, out[-3000:]
