"""Where a run's start-up goes: timestamped milestones of ``asyncrl run``, commit against commit.

    python -m benchmarks.demo.startup                         # this checkout, 4 runs
    python -m benchmarks.demo.startup --arm before@HEAD~3 --arm after@HEAD --runs 4

Each run is ``asyncrl run learner.steps=3`` (the demo, the warm-started model already cached:
start-up excludes the one-time warm start) whose output lines are stamped as they arrive, in
seconds since the spawn. Milestones: the actor starts its engine, the learner waits for the
actors (its model is loaded), the actor's engine is ready, the first step ends. Arms alternate
(A B, B A, ...) so machine noise hits both alike. An arm ``NAME@REV`` runs the code of commit
``REV`` in a temporary worktree (``benchmarks.worktrees``) with this checkout's model cache.
Output: ``results/<name>.json`` with every run and the mean and spread of each milestone.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import REPO, RESULTS, mean_std, write_result
from benchmarks.worktrees import Worktrees

MILESTONES = {
    "engine_start_s": "starting the vLLM engine",
    "learner_ready_s": "actor(s) to register",
    "engine_ready_s": "engine ready",
    "first_step_s": "step    0 |",
}


def one_run(checkout: Path, run_dir: Path, timeout: float) -> dict:
    """One ``asyncrl run`` of 3 steps from ``checkout``: each milestone's seconds since spawn."""
    cmd = [sys.executable, "-m", "asyncrl.orchestration.cli", "run", "learner.steps=3",
           "learner.checkpoint_every=0", "metrics_port=0", f"run_dir={run_dir}",
           f"model.cache_dir={REPO / '.cache' / 'asyncrl'}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=checkout, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    marks: dict[str, float] = {}
    tail: list[str] = []
    timer = threading.Timer(timeout, proc.kill)  # a run that hangs silently ends too
    timer.start()
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            now = time.monotonic() - t0
            tail = (tail + [line])[-40:]
            for key, needle in MILESTONES.items():
                if needle in line and key not in marks:
                    marks[key] = now
    finally:
        timer.cancel()
    code = proc.wait(60)
    if code != 0 or len(marks) < len(MILESTONES):
        raise SystemExit(f"startup: the run in {run_dir} failed or passed --timeout={timeout:g}s "
                         f"(exit {code}, milestones "
                         f"{sorted(marks)}):\n{''.join(tail)}")  # fmt: skip
    return marks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.demo.startup", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--arm", action="append", default=[], metavar="NAME@REV",
                   help="run commit REV's code (repeatable); none = this checkout")  # fmt: skip
    p.add_argument("--runs", type=int, default=4, help="runs per arm")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    p.add_argument("--name", default="startup")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    from asyncrl.core.config.load import load_config
    from asyncrl.orchestration.launch.preflight import resolve_model

    resolve_model(load_config(["metrics_port=0"]))  # the demo model, built once if missing
    arms = [a.partition("@") for a in args.arm] or [("this", "", "")]
    trees = Worktrees(Path(tempfile.mkdtemp(prefix="asyncrl-startup-")))
    try:
        checkouts = {n: trees.add(rev) if rev else REPO for n, _, rev in arms}
        runs = []
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.runs):
                for name, _, _ in arms if i % 2 == 0 else arms[::-1]:
                    marks = one_run(checkouts[name], Path(tmp) / f"{name}-{i}", args.timeout)
                    runs.append({"arm": name, "run": i, **marks})
                    print(f"[startup] {name} run {i}: " + ", ".join(
                        f"{k} {v:.2f}" for k, v in marks.items()), flush=True)  # fmt: skip
    finally:
        trees.close()
    per_arm = {n: {k: mean_std([r[k] for r in runs if r["arm"] == n]) for k in MILESTONES}
               for n, _, _ in arms}  # fmt: skip
    for name, figs in per_arm.items():
        print(f"{name:10s} " + ", ".join(f"{k} {v['mean']:.2f} ± {v['std']:.2f}"
                                          for k, v in figs.items()))  # fmt: skip
    config = {"arms": args.arm, "commits": trees.hashes, "runs": args.runs,
              "run": "asyncrl run learner.steps=3 learner.checkpoint_every=0 metrics_port=0",
              "cores_usable": sorted(os.sched_getaffinity(0))}  # fmt: skip
    print(
        f"wrote {write_result(args.name, {'config': config, 'per_arm': per_arm, 'runs': runs}, args.out)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
