"""Running both sides of ``benchmarks/vs_trl/run.py``: the TRL worker and ``asyncrl run``, each
in its own process session (a timeout ends only what that run started), and the parity check.

Clocks: both runs are timed from this process's spawn of them (``time.time()`` just before
``Popen``). The TRL worker stamps each step and validation itself (``--t0``); for ``asyncrl
run`` each line of ``metrics.jsonl`` and ``val.jsonl`` is stamped when it appears here (polled
every 0.1 s), which puts the origin of its ``elapsed_s`` on the same clock and gives each
validation its ``t_proc_s`` (when its figures were known, as the TRL worker's).

A run's ``val`` is its validations, ``{"step" (= the validated version), "t_proc_s",
"val/pass@1", "val/reward", "val/response_length", "val/seconds", ...}``; its ``steps`` carry
``completion_tokens`` (mean) and ``completion_tokens_p95`` of the step's training samples.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import REPO


def _rel(path: Path) -> str:
    """``path`` relative to the repository when inside it (no machine-specific prefix)."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def _spawn(
    cmd: list[str], log: Path, env: dict, cwd: Path = REPO
) -> tuple[subprocess.Popen, float]:
    t0 = time.time()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                                start_new_session=True)  # fmt: skip
    return proc, t0


def _wait(proc: subprocess.Popen, deadline: float, on_tick=None) -> int:
    """Wait for ``proc`` (calling ``on_tick`` every 0.1 s); past ``deadline``, SIGTERM its
    session (only the processes it started), then SIGKILL."""
    while proc.poll() is None:
        if on_tick:
            on_tick()
        if time.time() > deadline:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            return -1
        time.sleep(0.1)
    if on_tick:
        on_tick()
    return proc.returncode


def worker_cmd(overrides: list[str], out: Path, threads: int, *extra: str) -> list[str]:
    return [sys.executable, "-W", "ignore", "-m", "benchmarks.vs_trl.trl_worker", "--out", str(out),
            "--threads", str(threads), *extra, "--", *overrides]  # fmt: skip


def check_parity(overrides: list[str], out: Path, threads: int, cases: int) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    cmd = worker_cmd(overrides, out, threads, "--parity-only", "--parity-cases", str(cases))
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": str(threads)})  # fmt: skip
    path = out / "parity.json"
    if not path.is_file():
        tail = (proc.stdout + proc.stderr)[-3000:]
        return {"passed": False, "failures": [f"the parity check did not run:\n{tail}"]}
    return json.loads(path.read_text())


def run_trl(overrides: list[str], out: Path, threads: int, timeout: float) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    t0 = time.time()
    cmd = worker_cmd(overrides, out, threads, "--skip-parity", "--t0", repr(t0))
    proc, _ = _spawn(cmd, out / "trl.log", env)
    code = _wait(proc, t0 + timeout)
    run = {"system": "trl", "returncode": code, "log": _rel(out / "trl.log")}
    if code != 0 or not (out / "done.json").is_file():
        return {**run, "error": (out / "trl.log").read_text(errors="replace")[-3000:]}
    done = json.loads((out / "done.json").read_text())
    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines() if x]
    val_path = out / "val.jsonl"
    val = (
        [json.loads(x) for x in val_path.read_text().splitlines() if x]
        if val_path.is_file()
        else []
    )
    return {**run, "startup_s": done["startup_s"], "steps": steps, "val": val, "trl": done}


def _val_record(r: dict, seen_s: float, startup_s: float) -> dict:
    """An asyncrl val.jsonl record on the benchmark's clock; ``step`` is the validated version
    (as the TRL worker's), ``logged_at_step`` the learner step it was logged at."""
    return {**r, "step": int(r["val/version"]), "logged_at_step": r["step"], "t_proc_s": seen_s,
            "t_train_s": seen_s - startup_s}  # fmt: skip


class _Tail:
    """New complete lines of a file another process appends to, each with the seconds since
    ``t0`` at which this process first saw it."""

    def __init__(self, path: Path, t0: float) -> None:
        self.path, self.t0 = path, t0
        self.pos, self.buf = 0, b""
        self.seen: list[tuple[bytes, float]] = []

    def poll(self) -> None:
        if not self.path.is_file():
            return
        with open(self.path, "rb") as f:
            f.seek(self.pos)
            chunk = f.read()
        self.pos += len(chunk)
        *lines, self.buf = (self.buf + chunk).split(b"\n")
        now = time.time() - self.t0
        self.seen.extend((line, now) for line in lines if line.strip())


def run_asyncrl(
    overrides: list[str], run_dir: Path, timeout: float, checkout: Path | None = None
) -> dict:
    """``asyncrl run``; each metrics.jsonl line is stamped when it appears (polled every 0.1
    s), which places the ``elapsed_s`` origin on the spawn clock: start-up = min(seen -
    elapsed_s) over the steps. ``checkout``: run that checkout's code (another commit's
    worktree: its working directory and first on ``PYTHONPATH``) instead of this one's."""
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    run_dir.mkdir(parents=True)
    cmd = [sys.executable, "-m", "asyncrl.orchestration.cli", "run", *overrides,
           f"run_dir={run_dir}"]  # fmt: skip
    log = run_dir.parent / f"{run_dir.name}.log"
    env = {} if checkout is None else {"PYTHONPATH": str(checkout)}
    proc, t0 = _spawn(cmd, log, env, cwd=checkout or REPO)
    metrics, val = _Tail(run_dir / "metrics.jsonl", t0), _Tail(run_dir / "val.jsonl", t0)
    code = _wait(proc, t0 + timeout, lambda: (metrics.poll(), val.poll()))
    run = {"system": "asyncrl", "returncode": code, "log": _rel(log), "run_dir": _rel(run_dir)}
    if code != 0 or not metrics.seen:
        return {**run, "error": log.read_text(errors="replace")[-3000:]}
    recs = [(json.loads(line), t) for line, t in metrics.seen]
    startup = min(t - r["elapsed_s"] for r, t in recs)
    steps = [{"step": r["step"] + 1, "t_proc_s": startup + r["elapsed_s"], "t_train_s": r["elapsed_s"],
              "reward": r["reward"], "completion_tokens": r.get("response_len_mean"),
              "completion_tokens_p95": r.get("response_len_p95"), "seen_s": t}
             for r, t in recs]  # fmt: skip
    vals = [_val_record(json.loads(line), t, startup) for line, t in val.seen]
    summary = json.loads((run_dir / "summary.json").read_text())
    keep = ("train_wall_s", "final_version", "groups_dropped_stale", "trained_staleness_histogram")
    cores = next(
        (ln for ln in log.read_text().splitlines() if ln.startswith("[asyncrl] cores:")), ""
    )
    return {**run, "startup_s": startup, "steps": steps, "val": vals, "cores_line": cores,
            "summary": {k: summary.get(k) for k in keep}}  # fmt: skip
