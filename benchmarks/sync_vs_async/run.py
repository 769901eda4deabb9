"""Synchronous vs asynchronous RL on the same task, model, seeds and CPU cores.

    python -m benchmarks.sync_vs_async --quick     # 2 seeds x 100 steps, < 30 min on 2 cores
    python -m benchmarks.sync_vs_async             # 3 seeds x 300 steps (the demo's length)
    python -m benchmarks.sync_vs_async --setting long_tail --steps 100   # vs_trl's long_tail task
    python -m benchmarks.sync_vs_async --setting smollm2 --steps 9 --seeds 0 --extra-seeds 1
                                # SmolLM2-135M: every arm at seed 0, the best two at seed 1

Arms (C = the cores this process may use; "split" = learner ranks on the first half of
them, the actor on the second half, each pinned with sched_setaffinity):

    sync_colocated  mode=sync; the learner on all C cores (a rank per core, or one rank with
                    C threads: ``--colocated``) and vLLM bound to all C cores.
                    Generation and training alternate, each with every core (the classic
                    synchronous trainer; verl's hybrid engine).
    sync_split      mode=sync (max_staleness=0 + one batch per version); split cores.
    async_s<k>      mode=async, buffer.max_staleness=k for k in --staleness; split cores.

Every run is a real ``asyncrl run``; seeds vary the prompt stream (``task.seed``) while the
warm-started model stays the same. ``--setting demo`` (default): the demo model and addition
task. ``--setting long_tail``: ``benchmarks/vs_trl/long_tail.py``'s 23.6M-parameter model on
addition with long-tailed answer lengths (its per-seed prompt file and model, built once). Checkpoints are only
written at the end (``learner.checkpoint_every=0``) so disk I/O is not part of the race.

From each run: wall-clock time to a target reward (``--target``; default: a level every
run reaches, see ``sva_report.auto_target``), trained samples/s and tokens/s, actor and
learner idle fractions, weight-sync pause, staleness histogram, dropped-stale count, final
reward (mean and spread over seeds). From ``sync_split``: per-step generation time G and
training time T, and the ideal overlap bound (G+T)/max(G,T) next to the speedup each async
arm achieved. Output: ``benchmarks/results/<name>.json``, ``<name>_*.png``, ``<name>.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import REPO, RESULTS, asyncrl_run, write_with_table
from benchmarks.sync_vs_async.report import analyse, markdown, plot_all
from benchmarks.sync_vs_async.validation import analyse_val, best_arms, markdown_val, plot_val

PRESETS = {
    "full": {"steps": 300, "seeds": [0, 1, 2], "overrides": []},
    "quick": {"steps": 100, "seeds": [0, 1], "overrides": []},
    # schema tests: a few steps of the tiny preset (not a measurement)
    "tiny": {"steps": 6, "seeds": [0], "overrides": ["experiment=tiny"]},
}


def cpulist(cores: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (Linux cpu-list syntax)."""
    parts, i = [], 0
    while i < len(cores):
        j = i
        while j + 1 < len(cores) and cores[j + 1] == cores[j] + 1:
            j += 1
        parts.append(str(cores[i]) if i == j else f"{cores[i]}-{cores[j]}")
        i = j + 1
    return ",".join(parts)


def _cores_override(key: str, cores: list[int]) -> str:
    return f"{key}='{cpulist(cores)}'"  # quoted: Hydra reads a bare "0,2" as a list


def core_split(cores: list[int]) -> dict[str, list[int]]:
    """Learner on the first half of ``cores``, actor on the rest (at least one each)."""
    if len(cores) < 2:
        raise SystemExit(f"sync_vs_async needs at least 2 usable cores, have {cores}")
    half = len(cores) // 2
    return {"learner": cores[:half], "actor": cores[half:]}


def arm_overrides(
    cores: list[int],
    staleness: list[int],
    colocated: str = "ranks",
    stale_tokens: tuple[str, ...] = ("drop_group",),
    admission: tuple[str, ...] = ("capacity",),
) -> dict[str, list[str]]:
    """Each arm's overrides. ``colocated``: the sync_colocated learner on all the cores as one
    rank per core (``ranks``: FSDP2 over gloo) or as one rank with a thread per core
    (``threads``: no collectives; SmolLM2's step took 74-91 s as 2 ranks against ~55 s as one
    rank on one core, so ranks would handicap the synchronous arm). ``stale_tokens``: an
    async arm per bound and ``algorithm.stale_tokens`` option, ``async_s<k>`` for
    ``drop_group`` (the default) and ``async_s<k>_<option>`` for the others; ``admission``:
    those arms again per ``buffer.admission``, ``_window`` appended for ``window``; every async
    arm states its admission, since ``experiment=smollm2_math`` admits by window."""
    split = core_split(cores)
    pinned = [
        f"learner.nproc={len(split['learner'])}",
        _cores_override("learner.cpu_affinity", split["learner"]),
        _cores_override("actor.cpu_affinity", split["actor"]),
    ]
    arms = {
        "sync_colocated": [
            "mode=sync",
            *(
                [f"learner.nproc={len(cores)}"]
                if colocated == "ranks"
                else ["learner.nproc=1", f"learner.cpu_threads={len(cores)}"]
            ),  # fmt: skip
            _cores_override("learner.cpu_affinity", cores),
            _cores_override("actor.cpu_affinity", cores),
        ],
        "sync_split": ["mode=sync", *pinned],
    }
    for k in staleness:
        for option in stale_tokens:
            for paced in admission:
                name = f"async_s{k}" + ("" if option == "drop_group" else f"_{option}")
                chosen = [] if option == "drop_group" else [f"algorithm.stale_tokens={option}"]
                chosen.append(f"buffer.admission={paced}")  # stated: a preset may set window
                if paced != "capacity":
                    name = f"{name}_{paced}"
                arms[name] = ["mode=async", f"buffer.max_staleness={k}", *chosen, *pinned]
    return arms


SMOLLM2 = ["model=smollm2", "experiment=smollm2_math", "eval.at_start=false", "eval.every=3"]
"""``--setting smollm2``: the real model on examples/smollm2_math, validated every
3 versions and at the end; version 0 is validated once, not in every run (``--v0-pass1``)."""
SMOLLM2_V0_PASS1 = 0.125
"""Greedy val pass@1 of SmolLM2-135M-Instruct at version 0 on examples/smollm2_math's 64 val
prompts (benchmarks/results/smollm2_example.json; greedy, so the same in every arm)."""


def setting_overrides(setting: str, seed: int, steps: int, work: Path, tiny: bool) -> list[str]:
    """The task and model overrides of ``setting`` for ``seed`` (none for the demo)."""
    if setting == "demo":
        return []
    if setting == "smollm2":
        return list(SMOLLM2)
    from benchmarks.vs_trl.long_tail import prepare

    return prepare(work, seed, steps, tiny=tiny)


def load_run(arm: str, overrides: list[str], run_dir: Path) -> dict:
    """What a finished run wrote (summary, per-step records, actor stats)."""
    return {
        "arm": arm, "overrides": overrides, "run_dir": str(run_dir), "returncode": 0,
        "log": str(run_dir.parent / f"{run_dir.name}.log"), "reused": True,
        "summary": json.loads((run_dir / "summary.json").read_text()),
        "records": [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()],
        "actors": [json.loads(p.read_text()) for p in sorted(run_dir.glob("actor*.json"))],
        "val": _read_jsonl(run_dir / "val.jsonl"),
        **_read_json(run_dir / "bench_run.json"),  # process time and machine load, if recorded
    }  # fmt: skip


def _read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON-lines file, without their ``samples`` (none if it is missing)."""
    if not path.is_file():
        return []
    recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if k != "samples"} for r in recs]


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def run_arm(
    arm: str,
    overrides: list[str],
    run_dir: Path,
    timeout_s: float,
    keep_checkpoints: bool = False,
    env: dict[str, str] | None = None,
) -> dict:
    """One ``asyncrl run``; returns what it wrote (or the error and the log's tail). ``env``:
    environment variables for the run (benchmarks/multi_turn's latency; the repository goes on
    ``PYTHONPATH`` then, so a worker process imports the benchmark's environment), recorded in
    the result and ``bench_run.json``.

    A finished run's ``checkpoints/`` is removed unless ``keep_checkpoints``: the report reads
    none of it, and a real model's end-of-run checkpoint (2.2 GB for SmolLM2-135M with its
    optimizer state) times 18 runs once filled this machine's disk."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    cmd = asyncrl_run(overrides, run_dir)
    full_env = dict(os.environ, PYTHONUNBUFFERED="1")
    if env is not None:
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        full_env.update(env, PYTHONPATH=path)
    log = run_dir.parent / f"{run_dir.name}.log"
    t0, load = time.monotonic(), os.getloadavg()[0]
    with open(log, "w") as out:
        try:
            code = subprocess.run(
                cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s,
                env=full_env,
            ).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            code = -1
    result = {"arm": arm, "overrides": overrides, **({"env": env} if env is not None else {}),
              "run_dir": str(run_dir), "log": str(log),
              "returncode": code, "process_s": time.monotonic() - t0,
              "load_avg_1min_before": load, "load_avg_1min_after": os.getloadavg()[0]}  # fmt: skip
    if code != 0:
        result["error"] = log.read_text(errors="replace")[-3000:]
        return result
    keep = ("env", "process_s", "load_avg_1min_before", "load_avg_1min_after")
    (run_dir / "bench_run.json").write_text(json.dumps({k: result[k] for k in keep if k in result}))
    if not keep_checkpoints:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    return {**load_run(arm, overrides, run_dir), **result, "reused": False}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sync_vs_async", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--setting", choices=("demo", "long_tail", "smollm2"), default="demo",
                   help="the demo task, vs_trl's long_tail task (larger model, long tail), or "
                        "SmolLM2-135M-Instruct on examples/smollm2_math")  # fmt: skip
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.2, 0.25, 0.3],
                   help="validation pass@1 levels to time (runs that validate)")  # fmt: skip
    p.add_argument("--v0-pass1", type=float,
                   help="val pass@1 of version 0 where runs do not validate it "
                        f"(smollm2: {SMOLLM2_V0_PASS1})")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="2 seeds x 100 steps (< 30 min here)")
    p.add_argument("--tiny", action="store_true", help="schema check only: experiment=tiny")
    p.add_argument("--steps", type=int, help="learner steps per run (overrides the preset)")
    p.add_argument("--seeds", type=int, nargs="+", help="task seeds (overrides the preset)")
    p.add_argument("--staleness", type=int, nargs="+", default=[1, 2, 4],
                   help="max_staleness of the async arms (default 1 2 4)")  # fmt: skip
    p.add_argument("--stale-tokens", nargs="+", default=["drop_group"],
                   choices=("drop_group", "mask", "interpolate"),
                   help="algorithm.stale_tokens options: an async arm per bound and option "
                        "(the stale-token ablation; default drop_group only)")  # fmt: skip
    p.add_argument("--admission", nargs="+", default=["capacity"],
                   choices=("capacity", "window"),
                   help="buffer.admission options: the async arms again per option ("
                        "default capacity only)")  # fmt: skip
    p.add_argument("--arms", help="comma-separated subset of arms to run, in this order "
                   "(default: all)")  # fmt: skip
    p.add_argument("--colocated", choices=("ranks", "threads"),
                   help="sync_colocated's learner: a rank per core, or one rank with a thread "
                        "per core (default: threads for smollm2, ranks otherwise)")  # fmt: skip
    p.add_argument("--extra-seeds", type=int, nargs="+", default=[],
                   help="then these seeds for the best sync and the best async arm only "
                        "(sva_val.best_arms on the runs before)")  # fmt: skip
    p.add_argument("--target", type=float, help="target reward (default: auto, every run reaches it)")  # fmt: skip
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                   help="extra asyncrl override for every arm (repeatable)")  # fmt: skip
    p.add_argument("--reuse", action="store_true",
                   help="reuse finished runs found in --runs-dir (resume an interrupted run)")  # fmt: skip
    p.add_argument("--finished-only", action="store_true",
                   help="start no run: report the finished runs in --runs-dir and list the arms "
                        "and seeds not run yet (an ablation spread over several sessions)")  # fmt: skip
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep each finished run's checkpoints/ (default: removed, the report "
                        "reads none of it)")  # fmt: skip
    p.add_argument("--name", help="result name (default sync_vs_async[_quick|_tiny])")
    p.add_argument("--out", type=Path, default=RESULTS, help="where the JSON/PNG/MD go")
    p.add_argument("--runs-dir", type=Path, default=REPO / "runs" / "benchmarks",
                   help="where the runs' directories go (not committed)")  # fmt: skip
    return p.parse_args(argv)


def _chosen_arms(args: argparse.Namespace, cores: list[int], colocated: str) -> dict:
    """The arms' overrides (``arm_overrides``), only ``--arms`` in its order when given; an
    unknown name is refused, listing the arms."""
    arms = arm_overrides(
        cores, args.staleness, colocated, tuple(args.stale_tokens), tuple(args.admission)
    )
    if not args.arms:
        return arms
    wanted = args.arms.split(",")
    unknown = [a for a in wanted if a not in arms]
    if unknown:
        raise SystemExit(f"unknown arms {unknown}; arms are {list(arms)}")
    return {a: arms[a] for a in wanted}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    preset_name = "tiny" if args.tiny else "quick" if args.quick else "full"
    preset = PRESETS[preset_name]
    steps, seeds = args.steps or preset["steps"], args.seeds or preset["seeds"]
    suffix = ("" if args.setting == "demo" else f"_{args.setting}") + (
        "" if preset_name == "full" else f"_{preset_name}"
    )
    name = args.name or f"sync_vs_async{suffix}"
    cores = sorted(os.sched_getaffinity(0))
    colocated = args.colocated or ("threads" if args.setting == "smollm2" else "ranks")
    arms = _chosen_arms(args, cores, colocated)
    common = [*preset["overrides"], f"learner.steps={steps}", "learner.checkpoint_every=0",
              *args.extra]  # fmt: skip
    split = core_split(cores)
    print(f"[bench] cores {cpulist(cores)}: split arms learner on {cpulist(split['learner'])}, "
          f"actor on {cpulist(split['actor'])}; sync_colocated uses all of them", flush=True)  # fmt: skip
    runs, not_run = [], []
    v0 = args.v0_pass1 if args.v0_pass1 is not None else (
        SMOLLM2_V0_PASS1 if args.setting == "smollm2" else None)  # fmt: skip

    def one(arm: str, seed: int) -> None:
        task = setting_overrides(args.setting, seed, steps, args.runs_dir / name, args.tiny)
        overrides = [*task, *common, *arms[arm], f"task.seed={seed}"]
        print(f"[bench] {arm} seed {seed}: asyncrl run {' '.join(overrides)}", flush=True)
        run_dir = args.runs_dir / name / f"{arm}-seed{seed}"
        done = (run_dir / "summary.json").is_file() and list(run_dir.glob("actor*.json"))
        if (args.reuse or args.finished_only) and done:
            r = load_run(arm, overrides, run_dir)
        elif args.finished_only:
            print("[bench]   not run yet (--finished-only)", flush=True)
            not_run.append(f"{arm}-seed{seed}")
            return
        else:
            per_step = 150 if args.setting == "smollm2" else 30  # a real model's steps
            timeout_s = 600 + per_step * steps
            r = run_arm(arm, overrides, run_dir, timeout_s, args.keep_checkpoints)
        r["seed"] = seed
        _say_done(r)
        runs.append(r)

    for seed in seeds:
        for arm in arms:
            one(arm, seed)
    if args.extra_seeds:
        best = best_arms(runs, list(arms), args.thresholds, v0)
        print(f"[bench] extra seeds {args.extra_seeds} for the best arms of the seeds so far: "
              f"{', '.join(best)}", flush=True)  # fmt: skip
        for seed in args.extra_seeds:
            for arm in best:
                one(arm, seed)
    if not runs:
        raise SystemExit(f"no finished run of {list(arms)} in {args.runs_dir / name}: "
                         "run without --finished-only first")  # fmt: skip
    config = {"setting": args.setting, "preset": preset_name, "steps": steps, "seeds": seeds,
              "extra_seeds": args.extra_seeds, "staleness": args.staleness,
              "stale_tokens": args.stale_tokens, "admission": args.admission,
              "colocated_learner": colocated,
              "common_overrides": common, "arms": arms, "cores": cores, "core_split": split,
              "seed_meaning": "task.seed (prompt stream); model seed=0 in every run",
              "not_run": not_run}  # fmt: skip
    _report(args, name, runs, config, v0)
    return 0 if all(r["returncode"] == 0 for r in runs) else 1


def _report(args: argparse.Namespace, name: str, runs: list[dict], config: dict, v0) -> None:
    """Analyse ``runs`` (the arms that have one; ``config["not_run"]`` lists the rest) and
    write ``<out>/<name>.{json,md}`` and the plots."""
    ran = [a for a in config["arms"] if any(r["arm"] == a for r in runs)]
    report = analyse(runs, ran, args.target)
    val = None
    if any(r.get("val") for r in runs):
        val = analyse_val(runs, ran, args.thresholds, v0)
        report["validation"] = val
    args.out.mkdir(parents=True, exist_ok=True)
    plots = plot_all(runs, report, args.out, name)
    table = markdown(report)
    if val is not None:
        plots = [*plots, plot_val(val, args.out, name)]
        table += "\n\nValidation (pass@1, greedy):\n\n" + markdown_val(val)
    if config["not_run"]:
        table += f"\n\nNot run yet (arm-seed): {', '.join(config['not_run'])}"
    payload = {"config": config, **report, "plots": plots, "runs": _slim(runs)}
    write_with_table(name, payload, table, args.out, "bench")


def _say_done(r: dict) -> None:
    if r["returncode"]:
        print(f"[bench]   FAILED (code {r['returncode']}); log: {r['log']}", flush=True)
        return
    s = r["summary"]
    print(f"[bench]   done in {r.get('process_s', float('nan')):.0f}s: train {s.get('train_wall_s', 0):.0f}s, "
          f"reward {s['reward_initial']:.3f} -> {s['reward_final']:.3f}, dropped stale "
          f"{s['groups_dropped_stale']}", flush=True)  # fmt: skip


def _slim(runs: list[dict]) -> list[dict]:
    """Runs for the JSON: per-step curves kept short (step, elapsed, reward, timings)."""
    keep = ("step", "version", "elapsed_s", "reward", "step_s", "waiting_data_s", "busy_s",
            "weight_sync_s", "staleness_mean", "cpu_s", "response_len_mean",
            "response_len_p95", "tokens_masked_stale", "trained_token_frac", "length_bias")  # fmt: skip
    out = []
    for r in runs:
        r = dict(r)
        r["records"] = [{k: rec.get(k) for k in keep} for rec in r.get("records", [])]
        out.append(r)
    return out


if __name__ == "__main__":
    sys.exit(main())
