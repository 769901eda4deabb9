"""TRL's GRPOTrainer against asyncrl on the same job, model, prompts, reward and machine.

    python -m benchmarks.vs_trl                        # demo: 2 seeds x 400 steps each
    python -m benchmarks.vs_trl --steps 100 --seeds 0  # shorter
    python -m benchmarks.vs_trl --setting long_tail    # larger model, long-tailed lengths
    python -m benchmarks.vs_trl --setting smollm2      # SmolLM2-135M-Instruct on math words
    python -m benchmarks.vs_trl --tiny                 # schema check: 3 steps, 1 seed, 4 x 4
    python -m benchmarks.vs_trl --parity-only          # prepare and check parity; time nothing
    python -m benchmarks.vs_trl --reanalyse results/vs_trl_long_tail.json --thresholds 0.1 0.2
                                                       # the same runs at other thresholds

A user on one machine who wants GRPO picks TRL's ``GRPOTrainer``: synchronous, one process.
Per seed, in alternating order, this runs

    trl      benchmarks/vs_trl/trl_worker.py: GRPOTrainer, its own process, ``--threads`` torch
             threads (OMP_NUM_THREADS too), on the cores this process may use;
    asyncrl  ``asyncrl run`` with the demo defaults (learner 1 rank x 1 thread on the first
             usable core, 1 vLLM actor x 1 thread on the rest: ``cpu_affinity: auto``) plus
             ``ASYNCRL_OVERRIDES`` below.

Both sides are built from one asyncrl config (the setting's overrides, ``--set``, the seed):
the TRL worker composes it too and takes the model directory, prompt source (cursor order),
reward function and every hyperparameter from it. TRL's GRPOConfig for the demo:
``per_device_train_batch_size`` = 16 x 8 completions, ``num_generations=8``,
``steps_per_generation=1`` (one generation per step, on-policy), ``max_completion_length=8``,
``temperature=1``, ``top_p=1``, ``top_k=0`` (off), ``loss_type="dapo"`` (sum over the step's
tokens / their number: asyncrl's ``token_mean``; "grpo" averages per sequence first,
"dr_grpo" divides by a constant, "bnpo" equals "dapo" here as nothing is accumulated),
``scale_rewards="group"`` (asyncrl's GRPO advantage (r - mean) / (std + eps): TRL's eps is
1e-4, ours 1e-6), ``epsilon=epsilon_high=0.2``, ``beta=0`` (the demo has no KL),
``num_iterations=1``, ``max_grad_norm=1``, ``bf16=False`` (float32), ``gradient_checkpointing
=False``, ``shuffle_dataset=False``; AdamW(lr 2e-4, weight decay 0) with asyncrl's warm-up
``lr * min(1, (v + 1) / 10)`` passed as the trainer's optimizer and scheduler. On-policy,
asyncrl's decoupled PPO loss is the same clipped objective; asyncrl trains up to
``buffer.max_staleness=1`` versions behind (that is the comparison).

The ``smollm2`` setting is ``asyncrl run model=smollm2 experiment=smollm2_math``: the real
SmolLM2-135M-Instruct (float32), verl chat prompts rendered by its chat template (TRL gets the
rendered text and tokenizes it to the same ids), ``math_reward`` (math-verify, ``\\boxed{}``),
8 prompts x 4 samples, 128 new tokens at temperature 0.7, AdamW lr 1e-5 with the 10-step
warm-up, the same GRPOConfig fields otherwise, the 32 completions trained in 4 micro-batches
(``trl_worker.micro_batches``: memory; the loss is still the step's token mean). Completions stop at asyncrl's stop ids
(``asyncrl.actors.engine.stop_tokens``: here ``<|im_end|>``), which the worker gives TRL as the model's
``generation_config.eos_token_id``. Both validate greedily on the 64 val prompts at steps 0,
10, 20, ... and the end (asyncrl's ``eval``; TRL: ``vs_trl_validation.GreedyValidation``,
inside TRL's wall clock), and each run's ``val`` list and ``val_*`` figures report them.

Before any timing, ``vs_trl_parity.check`` runs for every seed (prompts, token ids, order,
rewards on 20 prompts x 11 completions, validation prompts, settings); on any mismatch the
script prints it and exits 2 without writing a result. Figures (``vs_trl_report.py``): steps/s, time to each
``--thresholds`` reward (moving mean over ``--window`` steps) with and without start-up,
initial/final reward, mean and spread over seeds. Output: ``<out>/<name>.json`` (config,
parity, pinning, every run's per-step curve) and ``<name>.png``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.common import REPO, RESULTS, read_result, write_result
from benchmarks.vs_trl.report import analyse, plot
from benchmarks.vs_trl.runs import check_parity, run_asyncrl, run_trl

ASYNCRL_OVERRIDES = {
    "learner.checkpoint_every=0": "TRL saves nothing (save_strategy='no'): no checkpoint I/O",
    "metrics_port=0": "no Prometheus endpoints (TRL serves none; no port clashes)",
}
"""The only overrides added to the demo defaults besides learner.steps and task.seed."""
TINY = ["learner.batch_groups=4", "sampling.n_samples=4", "model.sft_steps=50"]
SMOLLM2 = ["model=smollm2", "experiment=smollm2_math"]
"""The ``smollm2`` setting: ``asyncrl run model=smollm2 experiment=smollm2_math`` (8 prompts x 4
samples, 128 tokens at temperature 0.7, lr 1e-5, float32, greedy validation on the 64 val
prompts at steps 0, every 10 and the end). ``--tiny`` keeps every setting (2 steps)."""
STEPS = {"demo": 400, "long_tail": 400, "smollm2": 30}
TINY_STEPS = {"demo": 3, "long_tail": 3, "smollm2": 2}
STEP_TIMEOUT_S = {"demo": 30, "long_tail": 30, "smollm2": 300}
"""A run's time limit: 600 s + this x steps (smollm2: 32 x 128 tokens a step on CPU, and four
greedy validations of 64 prompts in 30 steps)."""


def setting_overrides(setting: str, args, seed: int, work: Path) -> list[str]:
    """The asyncrl config overrides of ``setting`` for ``seed`` (data and model prepared)."""
    if setting == "demo":
        return TINY if args.tiny else []
    if setting == "smollm2":
        return list(SMOLLM2)
    from benchmarks.vs_trl.long_tail import prepare

    return prepare(work, seed, args.steps, tiny=args.tiny)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.vs_trl", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--setting", choices=tuple(STEPS), default="demo")
    p.add_argument("--steps", type=int,
                   help="optimizer steps per run (default 400, smollm2 30; --tiny 3, smollm2 2)")  # fmt: skip
    p.add_argument("--seeds", help="comma-separated task seeds (default 0,1; --tiny 0)")
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.3, 0.4, 0.5, 0.6])
    p.add_argument("--window", type=int, default=10, help="moving-mean window (steps)")
    p.add_argument("--threads", type=int, default=2, help="TRL's torch threads")
    p.add_argument("--parity-cases", type=int, default=20)
    p.add_argument("--tiny", action="store_true",
                   help="schema check: 3 steps, 1 seed, 4 x 4 (smollm2: 2 steps, its own batch)")  # fmt: skip
    p.add_argument("--reanalyse", type=Path, metavar="JSON",
                   help="re-report a result's runs at --thresholds/--window (nothing is run); "
                        "writes <name> (default: the JSON's name + _reanalysed)")  # fmt: skip
    p.add_argument("--parity-only", action="store_true",
                   help="prepare the setting and check parity for every seed; run nothing timed")  # fmt: skip
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                   help="extra asyncrl config override, for both systems (repeatable)")  # fmt: skip
    p.add_argument("--name", help="result name (default vs_trl[_<setting>][_tiny])")
    p.add_argument("--out", type=Path, default=RESULTS, help="where the JSON and PNG go")
    p.add_argument("--runs-dir", type=Path, default=REPO / "runs" / "benchmarks",
                   help="where the runs' files go (not committed)")  # fmt: skip
    args = p.parse_args(argv)
    args.steps = args.steps or (TINY_STEPS if args.tiny else STEPS)[args.setting]
    args.seeds = [int(s) for s in (args.seeds or ("0" if args.tiny else "0,1")).split(",")]
    suffix = ("" if args.setting == "demo" else f"_{args.setting}") + ("_tiny" if args.tiny else "")
    args.name_given = args.name is not None
    args.name = args.name or f"vs_trl{suffix}"
    args.window = min(args.window, args.steps)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return reanalyse(args)
    work = args.runs_dir / args.name
    per_seed = {}
    for seed in args.seeds:
        base = setting_overrides(args.setting, args, seed, work)
        per_seed[seed] = [*base, *args.extra, f"learner.steps={args.steps}", f"task.seed={seed}"]
    _prepare_model(per_seed[args.seeds[0]])
    parity = {}
    for seed, ovr in per_seed.items():
        parity[seed] = check_parity(
            ovr, work / f"parity-seed{seed}", args.threads, args.parity_cases
        )
        if not parity[seed]["passed"]:
            print(f"[vs_trl] PARITY FAILED for seed {seed}; refusing to report:", file=sys.stderr)
            for line in parity[seed]["failures"][:20]:
                print(f"  {line}", file=sys.stderr)
            return 2
        print(f"[vs_trl] parity seed {seed}: {parity[seed]['summary']}", flush=True)
    if args.parity_only:
        print(f"[vs_trl] parity passed for seeds {args.seeds} (--parity-only: no timed run)")
        return 0
    runs, timeout = [], 600 + STEP_TIMEOUT_S[args.setting] * args.steps
    for k, seed in enumerate(args.seeds):
        for system in ("trl", "asyncrl") if k % 2 == 0 else ("asyncrl", "trl"):
            print(f"[vs_trl] {system} seed {seed}", flush=True)
            if system == "trl":
                r = run_trl(per_seed[seed], work / f"trl-seed{seed}", args.threads, timeout)
            else:
                ovr = [*per_seed[seed], *ASYNCRL_OVERRIDES]
                r = run_asyncrl(ovr, work / f"asyncrl-seed{seed}", timeout)
            runs.append({**r, "seed": seed})
            if r["returncode"] != 0 or "error" in r:
                print(f"[vs_trl]   FAILED ({r['returncode']}); log: {r['log']}", file=sys.stderr)
                return 1
            last = r["steps"][-1]
            print(f"[vs_trl]   start-up {r['startup_s']:.1f} s, first step at "
                  f"{r['steps'][0]['t_proc_s']:.1f} s, {len(r['steps'])} steps in "
                  f"{last['t_train_s']:.1f} s, last reward {last['reward']:.3f}", flush=True)  # fmt: skip
    report = analyse(runs, args.thresholds, args.window)
    args.out.mkdir(parents=True, exist_ok=True)
    png = plot(runs, args.thresholds, args.window, args.out / f"{args.name}.png")
    payload = {"config": _config(args, per_seed, runs), "parity": _parity_summary(parity),
               "pinning": _pinning(args, runs), **report, "plot": Path(png).name,
               "runs": runs}  # fmt: skip
    path = write_result(args.name, payload, args.out)
    print("\n".join(["", *report["verdicts"], f"[vs_trl] wrote {path} and {png}"]), flush=True)
    return 0


def reanalyse(args) -> int:
    """Report the runs of an earlier result at other thresholds (or window): the figures of
    ``vs_trl_report`` recomputed from each run's per-step curve; config, parity and pinning
    are kept, with where they came from."""

    doc = read_result(args.reanalyse)
    if not args.name_given:
        args.name = f"{doc['name']}_reanalysed"
    window = min(args.window, min(len(r["steps"]) for r in doc["runs"]))
    report = analyse(doc["runs"], args.thresholds, window)
    args.out.mkdir(parents=True, exist_ok=True)
    png = plot(doc["runs"], args.thresholds, window, args.out / f"{args.name}.png")
    config = {**doc["config"], "thresholds": args.thresholds, "window": window}
    payload = {"config": config, "reanalysed_from": {k: doc[k] for k in ("name", "created",
               "command", "commit")}, "parity": doc["parity"], "pinning": doc["pinning"],
               **report, "plot": Path(png).name, "runs": doc["runs"]}  # fmt: skip
    path = write_result(args.name, payload, args.out)
    print("\n".join([*report["verdicts"], f"[vs_trl] wrote {path} and {png}"]), flush=True)
    return 0


def _prepare_model(overrides: list[str]) -> None:
    """Build (or find cached) the warm-started model once, before anything is timed."""
    from asyncrl.core.config.load import load_config
    from asyncrl.orchestration.launch.preflight import resolve_model

    resolve_model(load_config(overrides))


def _config(args, per_seed: dict, runs: list[dict]) -> dict:
    trl = next((r["trl"] for r in runs if r["system"] == "trl"), {})
    return {"setting": args.setting, "tiny": args.tiny, "steps": args.steps, "seeds": args.seeds,
            "thresholds": args.thresholds, "window": args.window,
            "overrides_both": {str(s): o for s, o in per_seed.items()},
            "asyncrl_extra_overrides": ASYNCRL_OVERRIDES, "trl_grpo_config": trl.get("settings"),
            "trl_optimizer": "AdamW(lr, weight_decay) + LambdaLR(min(1, (step + 1) / warmup_steps))",
            "model_dir": trl.get("model_dir"),
            "seed_meaning": "task.seed (prompt stream) and TRL's GRPOConfig.seed; model seed=0"}  # fmt: skip


def _parity_summary(parity: dict) -> dict:
    return {"passed": all(p["passed"] for p in parity.values()),
            "per_seed": {str(s): p for s, p in parity.items()}}  # fmt: skip


def _pinning(args, runs: list[dict]) -> dict:
    trl = next((r["trl"] for r in runs if r["system"] == "trl"), {})
    cores = next((r["cores_line"] for r in runs if r["system"] == "asyncrl"), "")
    return {"trl": f"one process, torch.set_num_threads({args.threads}) and OMP_NUM_THREADS="
                   f"{args.threads}, affinity = the benchmark's cores {trl.get('cores')} "
                   "(threads not pinned one by one)",
            "asyncrl": f"the demo's launcher defaults (cpu_affinity: auto unless --set): "
                       f"{cores.removeprefix('[asyncrl] ')}"}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
