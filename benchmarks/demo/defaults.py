"""Choosing the demo's defaults by measurement: whole ``asyncrl run``s, side by side.

    python -m benchmarks.demo.defaults                     # 4 arms x 2 reps x 100 steps, ~12 min
    python -m benchmarks.demo.defaults --arm mine:learner.sync_every=4 --reps 3
    python -m benchmarks.demo.defaults --arm before@HEAD~1: --arm after:   # code, not config

Each arm is ``asyncrl run`` with the config defaults plus the arm's overrides (and
``learner.checkpoint_every=0 metrics_port=0``, as ``benchmarks/vs_trl/run.py``). The default arms
are the candidate defaults, each differing from its neighbour in one thing:

  r2_free        learner.nproc=2, nothing pinned (the old defaults)
  r1_free        learner.nproc=1, nothing pinned
  r1_split       learner.nproc=1, learner on the first half of the usable cores, the actor on
                 the second (``learner.cpu_affinity``, ``actor.cpu_affinity``)
  r1_split_s2    r1_split with ``learner.sync_every=2``

``--arm NAME@REV:overrides`` runs the code of commit ``REV`` (a temporary ``git worktree``,
removed at the end) with the demo model cached in this checkout (``model.cache_dir``), so
two commits compare side by side.

Reps run the arms in alternating order (A B C D, D C B A, ...) so machine noise hits every arm
alike. Per run: start-up (spawn to first step), steps/s over training, the learner's busy and
sync seconds per step, the final reward (mean of the last ``--window`` steps) and the time to
``--thresholds`` (moving mean), with and without start-up (``benchmarks.vs_trl.report``).
Per arm: means and spreads over reps. Output: ``<out>/<name>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from benchmarks.common import REPO, RESULTS, mean_std, write_result
from benchmarks.vs_trl.report import run_figures
from benchmarks.vs_trl.runs import run_asyncrl
from benchmarks.worktrees import Worktrees

COMMON = ["learner.checkpoint_every=0", "metrics_port=0"]


def _cores(cores: list[int]) -> tuple[str, str]:
    half = max(1, len(cores) // 2)
    learner, actor = cores[:half], cores[half:] or cores[:half]
    return ",".join(map(str, learner)), ",".join(map(str, actor))


def default_arms() -> dict[str, list[str]]:
    lc, ac = _cores(sorted(os.sched_getaffinity(0)))
    split = ["learner.nproc=1", f"learner.cpu_affinity='{lc}'", f"actor.cpu_affinity='{ac}'"]
    free = ["learner.cpu_affinity=''", "actor.cpu_affinity=''"]
    return {
        "r2_free": ["learner.nproc=2", *free],
        "r1_free": ["learner.nproc=1", *free],
        "r1_split": split,
        "r1_split_s2": [*split, "learner.sync_every=2"],
    }


def parse_arm(text: str) -> tuple[str, list[str]]:
    """``NAME[@REV]:k=v,k=v`` (values may not contain commas here; quote lists as ``'0'``);
    the name keeps its ``@REV``."""
    name, _, rest = text.partition(":")
    if not name or not _:
        raise SystemExit(f"--arm {text!r}: expected NAME[@REV]:key=value[,key=value...]")
    return name, [kv for kv in rest.split(",") if kv]


def _learner_time(run_dir: Path) -> dict:
    """The learner's mean seconds per step in each state (metrics.jsonl: busy, waiting for
    data, weight sync) and rank 0's CPU seconds per step."""
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    keys = ("busy_s", "waiting_data_s", "weight_sync_s", "cpu_s")
    return {f"learner_{k}": sum(r.get(k, 0.0) for r in recs) / max(1, len(recs)) for k in keys}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.demo.defaults", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="NAME:K=V,...",
        help="replace the default arms (repeatable)",
    )
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.3, 0.4])
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--name", default="demo_defaults")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--runs-dir", type=Path, default=REPO / "runs" / "benchmarks")
    args = p.parse_args(argv)
    arms = dict(map(parse_arm, args.arm)) if args.arm else default_arms()
    names = list(arms)
    trees = Worktrees(args.runs_dir / args.name / "worktrees")
    try:
        return _run_arms(args, arms, names, trees)
    finally:
        trees.close()


def _run_arms(args, arms: dict[str, list[str]], names: list[str], trees: Worktrees) -> int:
    checkouts = {n: trees.add(n.partition("@")[2]) for n in names if "@" in n}
    cache = [f"model.cache_dir={REPO / '.cache' / 'asyncrl'}"]
    runs = []
    for rep in range(args.reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            ovr = [*arms[name], *COMMON, f"learner.steps={args.steps}", f"seed={args.seed}"]
            ovr += cache if name in checkouts else []
            safe = "".join(c if c.isalnum() or c in "_-" else "_" for c in name)
            run_dir = args.runs_dir / args.name / f"{safe}-rep{rep}"
            print(f"[demo_defaults] rep {rep} {name}: {' '.join(arms[name])}", flush=True)
            r = run_asyncrl(ovr, run_dir, 600 + 10 * args.steps, checkouts.get(name))
            if r["returncode"] != 0 or "error" in r:
                print(f"[demo_defaults]   FAILED ({r['returncode']}); log: {r['log']}",
                      file=sys.stderr)  # fmt: skip
                return 1
            fig = run_figures(r, args.thresholds, args.window)
            runs.append({"arm": name, "rep": rep, **fig, **_learner_time(run_dir),
                         "cores_line": r["cores_line"]})  # fmt: skip
            print(f"[demo_defaults]   start-up {fig['startup_s']:.1f} s, first step at "
                  f"{fig['first_step_s']:.1f} s, "
                  f"{fig['steps_per_s']:.2f} steps/s, final reward {fig['reward_final']:.3f}",
                  flush=True)  # fmt: skip
    per_arm = {}
    for name in names:
        mine = [r for r in runs if r["arm"] == name]
        per_arm[name] = {k: mean_std([r[k] for r in mine]) for k in
                         ("startup_s", "first_step_s", "steps_per_s", "steps_per_s_with_startup",
                          "reward_final", "learner_busy_s", "learner_waiting_data_s",
                          "learner_weight_sync_s", "learner_cpu_s")}  # fmt: skip
    config = {"arms": arms, "commits": trees.hashes, "common": COMMON, "steps": args.steps, "reps": args.reps,
              "seed": args.seed, "thresholds": args.thresholds, "window": args.window,
              "cores_usable": sorted(os.sched_getaffinity(0))}  # fmt: skip
    path = write_result(args.name, {"config": config, "per_arm": per_arm, "runs": runs}, args.out)
    for name, a in per_arm.items():
        sps, st, rf = a["steps_per_s"], a["startup_s"], a["reward_final"]
        busy, wait = a["learner_busy_s"]["mean"], a["learner_waiting_data_s"]["mean"]
        print(f"{name:14s} {sps['mean']:.2f} ± {sps['std']:.2f} steps/s, start-up "
              f"{st['mean']:.1f} s, first step at {a['first_step_s']['mean']:.1f} s, final reward {rf['mean']:.3f}, learner busy {busy:.3f} "
              f"/ waiting {wait:.3f} s per step")  # fmt: skip
    print(f"[demo_defaults] wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
