"""LoRA against full fine-tuning end to end: time to validation accuracy and final accuracy.

    python -m benchmarks.lora.end_to_end          # SmolLM2, 9 steps: ~65 min here (5 runs)

Real ``asyncrl run model=smollm2 experiment=smollm2_math`` runs (the sync_vs_async smollm2
setting: validated every 3 versions and at the end, version 0's greedy pass@1 taken as
``--v0-pass1`` since it is the same model in every arm), the learner one rank pinned to the
first core and the actor to the second, ``checkpoint_every=0``. Arms:

    full               the model preset's full fine-tuning (its learning rate, 1e-5)
    lora_r<R>_lr<LR>   ``model.lora.rank=R`` with ``learner.lr=LR``, one arm per ``--lrs``

First every arm at the first seed; the LoRA learning rate with the highest final pass@1 there
(ties: the higher mean training reward) is the chosen one, and ``full`` and it run the other
seeds. Output: ``benchmarks/results/<name>.{json,md}`` and ``<name>_val.png``: per arm the
sync_vs_async validation figures (time to each pass@1 threshold, final pass@1 with its standard
error), steps per wall-second and median step time, and the verdict of the issue's target:
the chosen LoRA arm reaches full fine-tuning's final pass@1 within noise, and no later.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from pathlib import Path

from benchmarks.common import REPO, RESULTS, md_table, write_with_table
from benchmarks.sync_vs_async.run import (
    SMOLLM2,
    SMOLLM2_V0_PASS1,
    core_split,
    cpulist,
    load_run,
    run_arm,
)
from benchmarks.sync_vs_async.validation import analyse_val, markdown_val, plot_val


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.lora.end_to_end", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--steps", type=int, default=9, help="learner steps per run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="task seeds")
    p.add_argument("--rank", type=int, default=8, help="model.lora.rank of the LoRA arms")
    p.add_argument("--lrs", type=float, nargs="+", default=[1e-4, 3e-4],
                   help="the LoRA arms' learning rates, tried at the first seed")  # fmt: skip
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.2, 0.25, 0.3])
    p.add_argument("--v0-pass1", type=float, default=SMOLLM2_V0_PASS1)
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                   help="extra asyncrl override for every arm (repeatable)")  # fmt: skip
    p.add_argument("--reuse", action="store_true",
                   help="reuse finished runs found in --runs-dir (resume an interrupted run)")  # fmt: skip
    p.add_argument("--name", default="lora_end_to_end")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--runs-dir", type=Path, default=REPO / "runs" / "benchmarks")
    return p.parse_args(argv)


def lora_arm(rank: int, lr: float) -> str:
    return f"lora_r{rank}_lr{lr:g}"


def arms_of(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each arm's own overrides (the common ones are added per run)."""
    arms = {"full": []}
    for lr in args.lrs:
        arms[lora_arm(args.rank, lr)] = [f"model.lora.rank={args.rank}", f"learner.lr={lr:g}"]
    return arms


def pinned(cores: list[int]) -> list[str]:
    split = core_split(cores)
    return [f"learner.nproc={len(split['learner'])}",
            f"learner.cpu_affinity='{cpulist(split['learner'])}'",
            f"actor.cpu_affinity='{cpulist(split['actor'])}'"]  # fmt: skip


def choose_lr(runs: list[dict], lora_arms: list[str]) -> str:
    """The LoRA arm with the highest final validation pass@1 (ties: mean training reward)."""

    def score(arm: str) -> tuple[float, float]:
        r = next((r for r in runs if r["arm"] == arm and r["returncode"] == 0), None)
        if r is None or not r.get("val"):
            return (-1.0, -1.0)
        last = max(r["val"], key=lambda x: x["val/version"])
        return (last["val/pass@1"], statistics.fmean(x["reward"] for x in r["records"]))

    return max(lora_arms, key=score)


def speed(runs: list[dict], arm: str) -> dict:
    """Steps per wall-second (first step to last) and the median step time, over seeds."""
    ok = [r for r in runs if r["arm"] == arm and r["returncode"] == 0 and r.get("records")]
    rates, steps = [], []
    for r in ok:
        recs = r["records"]
        span = recs[-1]["elapsed_s"] - recs[0]["elapsed_s"]
        if span > 0 and len(recs) > 1:
            rates.append((len(recs) - 1) / span)
        steps += [x["step_s"] for x in recs]
    return {"steps_per_s": statistics.fmean(rates) if rates else None,
            "step_s_median": statistics.median(steps) if steps else None}  # fmt: skip


def verdict(val: dict, chosen: str) -> dict:
    """The issue's target: ``chosen`` reaches ``full``'s final pass@1 within noise (two
    standard errors of the difference), and reaches the highest threshold both reached on
    every seed no later."""
    a, f = val["arms"][chosen], val["arms"]["full"]
    fa, ff = a["final_pass1"], f["final_pass1"]
    noise = 2 * math.sqrt((fa["se"] or 0) ** 2 + (ff["se"] or 0) ** 2)
    diff = None if fa["mean"] is None or ff["mean"] is None else fa["mean"] - ff["mean"]
    out = {"arm": chosen, "final_diff": diff, "noise": noise,
           "final_within_noise": diff is not None and diff >= -noise}  # fmt: skip
    for t in sorted(val["thresholds"], reverse=True):
        ta, tf = a["time_to"][str(t)], f["time_to"][str(t)]
        if ta["seeds"] and tf["seeds"] and ta["reached"] == ta["seeds"] == tf["reached"]:
            out |= {"threshold": t, "lora_s": ta["mean"], "full_s": tf["mean"],
                    "no_later": ta["mean"] <= tf["mean"]}  # fmt: skip
            return out
    return out | {"threshold": None, "no_later": None,
                  "note": "no threshold was reached by both arms on every seed"}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    arms = arms_of(args)
    common = [*SMOLLM2, f"learner.steps={args.steps}", "learner.checkpoint_every=0",
              *pinned(cores), *args.extra]  # fmt: skip
    print(f"[bench] cores {cpulist(cores)}: {' '.join(pinned(cores))}", flush=True)
    runs: list[dict] = []

    def one(arm: str, seed: int) -> None:
        overrides = [*common, *arms[arm], f"task.seed={seed}"]
        print(f"[bench] {arm} seed {seed}: asyncrl run {' '.join(overrides)}", flush=True)
        run_dir = args.runs_dir / args.name / f"{arm}-seed{seed}"
        if args.reuse and (run_dir / "summary.json").is_file():
            r = load_run(arm, overrides, run_dir)
        else:
            r = run_arm(arm, overrides, run_dir, 600 + 150 * args.steps)
        r["seed"] = seed
        if r["returncode"]:
            print(f"[bench]   FAILED (code {r['returncode']}); log: {r['log']}", flush=True)
        else:
            last = max(r["val"], key=lambda x: x["val/version"]) if r.get("val") else {}
            print(f"[bench]   done in {r.get('process_s', 0):.0f}s: final val pass@1 "
                  f"{last.get('val/pass@1')}", flush=True)  # fmt: skip
        runs.append(r)

    for arm in arms:
        one(arm, args.seeds[0])
    lora_arms = [a for a in arms if a != "full"]
    chosen = choose_lr(runs, lora_arms)
    print(f"[bench] chosen LoRA arm (seed {args.seeds[0]}): {chosen}", flush=True)
    for seed in args.seeds[1:]:
        for arm in ("full", chosen):
            one(arm, seed)
    val = analyse_val(runs, list(arms), args.thresholds, args.v0_pass1)
    val["verdicts"] = {}  # sync_vs_async's sync-against-async verdicts do not apply
    report = {"validation": val, "chosen": chosen, "verdict": verdict(val, chosen),
              "speed": {a: speed(runs, a) for a in arms}}  # fmt: skip
    config = {"steps": args.steps, "seeds": args.seeds, "rank": args.rank, "lrs": args.lrs,
              "common_overrides": common, "arms": arms, "cores": cores,
              "pinning": "learner rank on the first half of the cores, the actor on the rest",
              "seed_meaning": "task.seed (prompt stream); model seed=0 in every run"}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    plot = plot_val(val, args.out, args.name)
    payload = {"config": config, **report, "plots": [plot] if plot else [],
               "runs": [_slim(r) for r in runs]}  # fmt: skip
    write_with_table(args.name, payload, _markdown(report, val), args.out, "bench")
    return 0 if all(r["returncode"] == 0 for r in runs) else 1


def _markdown(report: dict, val: dict) -> str:
    rows = [[a, s["steps_per_s"], s["step_s_median"]] for a, s in report["speed"].items()]
    v = report["verdict"]
    return "\n\n".join([
        md_table(["arm", "steps/s (wall)", "median step s"], rows),
        "Validation (pass@1, greedy):\n\n" + markdown_val(val),
        f"Verdict for {v['arm']}: final {v['final_diff']:+.3f} against full (noise {v['noise']:.3f}): "
        f"{'within' if v['final_within_noise'] else 'below'}; at pass@1 >= {v['threshold']}: "
        f"{'no later' if v['no_later'] else 'later' if v['no_later'] is False else '-'}",
    ])  # fmt: skip


def _slim(r: dict) -> dict:
    keep = ("step", "version", "elapsed_s", "reward", "step_s", "waiting_data_s", "busy_s",
            "weight_sync_s", "staleness_mean", "response_len_mean", "tokens_per_s")  # fmt: skip
    return {**r, "records": [{k: x.get(k) for k in keep} for x in r.get("records", [])]}


if __name__ == "__main__":
    sys.exit(main())
