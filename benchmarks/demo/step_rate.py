"""The demo's learner steps/s before and after the real-scale learner changes, in one run.

Those learner changes (chunked log-probs from the final hidden states,
``model.logprob_chunk_tokens``; scoring at ``sampling.temperature``; micro-batch planning;
sharded loading; packing) start at commit 1f45a05. This script checks out ``--base``
(default ``1f45a05^``, the commit before them) in a temporary ``git worktree`` (removed at the
end, also on an error or Ctrl-C) and times the demo's learner step at that checkout and at the
working tree:

  base    the base checkout, the default config (``load_config([])``: the demo / cpu preset);
  new     the working tree, the same;
  extra   ``--arm NAME[@REV]:key=value,...``: the working tree with these overrides, or with
          ``@REV`` a checkout of that commit (``@base``: the base's), e.g.
          ``--arm full_logits:model.logprob_chunk_tokens=0`` or ``--arm first@2b490e3:`` (each
          commit in a worktree of its own, removed at the end like the base's; a commit from
          2b490e3 on, the one-package layout, whose ``asyncrl.learner`` the worker imports).

Every arm runs the same small worker (``benchmarks/demo/step_rate_worker.py``, copied into a temp
directory) under ``torchrun --nproc_per_node=--nproc`` (default 2: the cpu preset's two gloo
ranks), with the arm's checkout first on ``PYTHONPATH`` and as the working directory, so each
arm imports its own ``asyncrl`` (the worker checks where ``asyncrl.learner`` came from).
Each rank pins ``torch.set_num_threads(--threads)`` (default 1, as
``learner.cpu_threads``) and ``OMP_NUM_THREADS``. The worker builds the step context with the
checkout's own ``asyncrl.learner.trainer.build_step_context`` from the default config (policy, AdamW,
the grpo preset), on one shared model directory: the demo architecture built by ``asyncrl``'s
demo code with random weights (seed 0), made once by this process. The batch is demo-shaped
and the same for every arm: ``learner.batch_groups`` (16) groups of ``sampling.n_samples`` (8),
prompts of the demo task (``asyncrl.actors.data.addition``, tokenized by the demo tokenizer), completions of
1 to ``sampling.max_tokens`` (8) tokens (mostly the answer's digits, some wrong, then EOS; some cut
at the limit), behaviour log-probs and rewards drawn from a fixed seed.

Timing: ``train_on_batch`` only (what ``asyncrl.learner.trainer`` calls once per step). Each arm's
ranks stay alive across rounds (idle ones poll a file); at start they run ``--warmup`` steps;
each round runs one more untimed step, then ``--steps`` timed ones (rank 0's wall clock, and
every rank's process CPU seconds, summed). Rounds alternate the order of arms (A B, B A, ...),
so machine noise (the cores are shared) hits every arm alike. Reported per arm: the median and
fastest step seconds over every timed step, steps/s = 1 / median; against ``base``, the
steps/s ratio (arm / base; < 1 is a drop) of each round's medians paired by round: median,
quartiles, min-max, how many rounds were slower; the fastest steps' ratio; and the same
per-round ratio of CPU seconds per step (less sensitive to other jobs on the cores).

``--full``: the whole demo too, ``asyncrl run learner.steps=--full-steps`` (default 30) in a
temp run directory, same overrides for both checkouts (the warm-started demo model from this
checkout's ``.cache/asyncrl``, shared), ``--full-reps`` pairs in A B / B A order; steps/s =
steps / ``train_wall_s`` from each run's ``summary.json`` (as benchmarks/demo/own_task.py), and the
learner's busy seconds per step. About 1.5 min per run here.

    python -m benchmarks.demo.step_rate                 # ~1.5-2 min on 2 shared cores
    python -m benchmarks.demo.step_rate --full          # + 2 whole demo runs, ~3 min more

This module holds the command line, the arms and ``main``; the rest is in
``benchmarks.demo.step_rate_bench`` (the shared model and batch, the workers and rounds, the whole
demo runs), ``step_rate_worker`` (the worker; ``--worker`` here runs it too),
``step_rate_report`` (figures, result file, tables) and ``worktrees`` (the git worktrees).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time

from benchmarks.demo import step_rate_worker
from benchmarks.demo.step_rate_bench import (
    Bench,
    batch_shape,
    build_batch_spec,
    build_model_dir,
    full_part,
    measure,
)
from benchmarks.demo.step_rate_report import report, summarise
from benchmarks.worktrees import git

NOTES = ("steps/s vs base = base's step seconds / the arm's, per round (each round's "
         "median over its timed steps); < 1 means the arm is slower. 'new' is the working "
         "tree, with whatever uncommitted changes it had (commit ends in -dirty then). "
         "CPU only; the cores are shared with other jobs (see machine.load_avg).")  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", default="1f45a05^", help="the commit before the change")
    p.add_argument("--rounds", type=int, default=30, help="interleaved rounds (every arm each)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per arm per round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps at each worker's start")
    p.add_argument("--nproc", type=int, default=2, help="learner ranks (cpu preset: 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--arm", action="append", default=[], metavar="NAME[@REV]:k=v,...",
                   help="an extra arm: the working tree (or commit REV, or @base) with these "
                   "overrides")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="model weights and batch")
    p.add_argument("--full", action="store_true", help="also time whole `asyncrl run`s")
    p.add_argument("--full-steps", type=int, default=30)
    p.add_argument("--full-reps", type=int, default=1, help="pairs of whole runs")
    p.add_argument("--timeout-s", type=float, default=600.0, help="per round / per whole run")
    p.add_argument("--out", default=None, help="results directory (benchmarks/results)")
    p.add_argument("--name", default=None, help="result name (demo_step_rate[_full])")
    return p.parse_args(argv)


def parse_arms(specs: list[str]) -> list[dict]:
    """``base`` and ``new`` (default config), then ``--arm NAME[@REV]:k=v,...``; an arm's
    ``checkout`` is ``base``, ``new`` (the working tree) or a git revision."""
    arms = [{"name": "base", "checkout": "base", "overrides": []},
            {"name": "new", "checkout": "new", "overrides": []}]  # fmt: skip
    for spec in specs:
        name, sep, rest = spec.partition(":")
        name, _, where = name.partition("@")
        if not name.isidentifier() or not sep:
            raise SystemExit(f"--arm {spec!r}: expected NAME[@REV]:key=value,...")
        if name in {a["name"] for a in arms}:
            raise SystemExit(f"--arm {spec!r}: arm {name!r} already exists")
        over = [o for o in rest.split(",") if o]
        arms.append({"name": name, "checkout": where or "new", "overrides": over})
    return arms


def run_config(args, arms: list[dict], hashes: dict) -> dict:
    """The JSON's config: the flags, the commits, the arms and what was pinned and timed."""
    config = {k: v for k, v in vars(args).items() if k != "out"}
    config |= {
        "base_commit": hashes["base"],
        "new_commit": hashes["new"],
        "arms": arms,
        "launch": f"torchrun --nproc_per_node={args.nproc} (gloo, CPU), one worker per arm "
        "alive across rounds",
        "pinned": {
            "torch_threads_per_rank": args.threads,
            "OMP_NUM_THREADS": args.threads,
            "core_affinity": "none (the OS schedules the ranks on the shared cores)",
        },  # fmt: skip
        "model": "demo architecture (asyncrl.orchestration.demo.model.demo_config()), random "
        f"weights, seed {args.seed}; one directory for every arm",
        "algorithm": "default config (grpo preset) of each checkout, load_config([])",
        "timed": "asyncrl.learner.compute.step.train_on_batch, rank 0's wall clock per step",
    }
    return config


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    if "--worker" in sys.argv[1:]:  # the worker's entry point (it used to live in this file)
        return step_rate_worker.main()
    args = parse_args()
    from asyncrl.core.config.load import load_config
    from benchmarks.common import git_commit

    t_start = time.monotonic()
    arms = parse_arms(args.arm)
    base_hash = git("rev-parse", "--verify", f"{args.base}^{{commit}}")
    signal.signal(signal.SIGTERM, _interrupt)  # clean up as on Ctrl-C
    bench = Bench(args, base_hash)
    try:
        for arm in arms:
            if arm["checkout"] != "new":
                bench.add_worktree(arm["checkout"])
        hashes = {**bench.hashes, "new": git_commit()}
        cfg = load_config([])
        model_dir = build_model_dir(bench.tmp / "model", args.seed)
        spec = build_batch_spec(cfg, args.seed)
        batch = bench.tmp / "batch.json"
        batch.write_text(json.dumps(spec))
        measured = measure(bench, arms, model_dir, batch)
        bench.stop_workers()
        results = summarise(arms, measured, hashes)
        full = full_part(bench) if args.full else None
    finally:
        bench.close()
    extra = {"config": run_config(args, arms, hashes), "batch": batch_shape(spec),
             "order": measured["order"], "wall_s": time.monotonic() - t_start,
             "notes": NOTES}  # fmt: skip
    report(args, arms, results, full, extra)


if __name__ == "__main__":
    main()
