"""Where asynchrony pays: synchronous against asynchronous RL on multi-turn episodes whose
environment answers slowly, with a long tail (issue 42, item 8).

    python -m benchmarks.multi_turn              # sync_split, async_s1/2/4: 2 seeds x 150 steps
    python -m benchmarks.multi_turn --admission capacity window   # and async_s<k>_window
    python -m benchmarks.multi_turn --latency-median-s 1 --latency-p99-s 20 --steps 60
                                                 # issue 42's example latency (~60 steps fit)
    python -m benchmarks.multi_turn --reuse --metric val/pass@1 --thresholds 0.05 0.1
                                  # re-report the finished runs at other thresholds (runs nothing)

The task: ``asyncrl run experiment=chain`` (the demo model, two chained sums per episode,
asyncrl/actors/data/chain.py) with ``episode.env=benchmarks.multi_turn.slow_env:SlowChain``:
each environment step first waits a lognormal delay (by default median 0.25 s, p99 5 s,
capped at 3 x p99: issue 42's example shape at a quarter of its scale, why in slow_env.py), a
pure function of the latency seed, the prompt, the episode's place among its group and the
turn, so every arm waits the same delays for the same episodes.

Arms, one after another on this machine and commit, each seed in turn (names as in
benchmarks/sync_vs_async; "split" = the learner on the first half of the usable cores, the
actor on the rest; the default: sync_split and an async arm per --staleness x --admission):

    sync_split         mode=sync: one batch per version, strictly on-policy; split
    async_s<k>         mode=async, buffer.max_staleness=k (--staleness, default 1 2 4),
                       buffer.admission=capacity; split
    async_s<k>_window  the same with buffer.admission=window (with --admission capacity window)
    sync_colocated     only when named in --arms: mode=sync, the learner (one rank, a thread
                       per core) and vLLM each on every core, taking turns
    sync_split_nolat   the calibration (not a contestant): sync_split with no environment
                       delay, on the first seed, --calibration-steps steps, no validation; it
                       measures G below (--no-calibration skips it)

Every arm runs the same job: the cached warm-started demo model, ``task.seed`` = the seed (the
prompt stream, and through it the delays), ``learner.steps`` = --steps (with --wall-s also
``learner.max_wall_s``: each arm stops at whichever comes first), ``actor.max_inflight`` =
--max-inflight (default 64 = 16 groups x the largest bound 4, so the admission rule, not the
actor's cap, decides how many groups are in flight; mode=sync still makes one batch per
version), one environment worker (``episode.env_workers=1``: its steps are
``asyncio.sleep``, so one worker hosts every episode at once),
``episode.env_timeout_s`` = the latency cap + 30 s (no drawn delay is ever a timeout; a
--set that leaves it at or below the cap is refused), validation of the 64 eval prompts
(``experiment=chain``'s: 4 episodes each, sampled at temperature 1, the policy RL trains) at the start, every
--eval-every versions and at the end (the environment is slow there too, and each arm pays
its validations as it would in use), and a checkpoint only at the end (removed once the run
is read). Seeds vary the prompts and delays; the model is the same.

Figures per run (``report.py``): time to each --thresholds level of the validation --metric
(default ``val/reward``, the mean episode reward of the sampled episodes: partial credit per turn;
``val/pass@1``: both sums exact) on two clocks (``elapsed``: as paid; ``train``: synchronous
arms' blocking validations subtracted), the final validation value, episodes trained and
generated per second, the actor's idle fraction (``actor<i>.json`` ``time_s``: no group in
flight), its ``waiting_env`` fraction (groups in flight, none at the engine: measured) and the
engine's estimated busy fraction (G x batches generated / the actor's active time), the
per-token staleness histogram (``summary.json`` ``trained_token_staleness_histogram``) and the
group one, the length bias (``summary.json``: trained against read mean length), dropped-stale
groups, the environment seconds an episode waited (``reward/env_delay_s``), step times, how
episodes ended; mean and spread over seeds. The verdict (issue 42's target): each async arm
against the synchronous arm with the best final value, per seed: how much sooner it first
reached that seed's synchronous final value (target >= 1.5x on at least 2 seeds) and whether
its final value is within noise (twice the standard error of the difference: the seeds'
spread, or the bound sqrt(p (1 - p) / prompts) of a [0, 1] mean, whichever is larger).

The ideal overlap bound, from measured generation, environment and training time per step:

    G  generation: seconds to generate one batch (batch_groups x n episodes, every turn) when
       the environment answers at once: the calibration arm's median wait for data per step
       (in mode=sync the learner waits exactly while the actor generates the next batch)
    T  training: sync_split's median (step_s - waiting_data_s), the learner's work and weight
       sync per step (the same work in every arm)
    W  sync_split's median waiting_data_s: generation plus the environment's time on the
       batch's critical path
    E  = W - G: the environment time one synchronous step waits for (its slowest episodes'
       delays; the mean delay an episode waits is reported beside it)

A synchronous step costs W + T = G + E + T. An asynchronous learner with unlimited episodes in
flight hides the environment completely and overlaps generation with training, so a step
costs max(G, T) at best, and

    bound = (G + E + T) / max(G, T)

is the most any asynchronous arm can gain in steps/s over sync_split here (sync_vs_async's
(G+T)/max(G,T) with the environment's E added to the synchronous step). With its staleness
bound k an async arm has at most C_k = min(actor.max_inflight, batch_groups x max(1, k))
groups leased or unread (``buffer.capacity``; the window admits no more), and a group holds
its slot at least R seconds, the expected slowest of its n episodes' environment time (a Monte
Carlo of slow_env's own delays with the measured environment steps per episode), so by
Little's law it makes at most C_k / R groups a second, batch_groups a step:

    bound_k = (G + E + T) / max(G, T, batch_groups x R / C_k)

reported per async arm next to the speed-up it achieved (sync_split's median step time over
its own). Without the calibration arm G (and the bounds) are not reported.

TRL: no ``GRPOTrainer(environment_factory=...)`` arm; ``TRL_FINDING`` says why.

Output: ``<out>/<name>.json`` (config, machine, commit, command; the runs' per-step traces in
``<name>.records.json.gz``), ``<name>.md``, ``<name>_val.png`` (validation value against wall
time), ``<name>_reward.png`` (training reward against wall time), ``<name>_staleness.png``
(per-token staleness histogram). Runs go to --runs-dir (not committed).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from benchmarks.common import REPO, RESULTS, write_with_table
from benchmarks.multi_turn import slow_env
from benchmarks.multi_turn.report import analyse, markdown, plot_all
from benchmarks.sync_vs_async.run import arm_overrides, core_split, cpulist, load_run, run_arm

ENV_SPEC = "benchmarks.multi_turn.slow_env:SlowChain"
TIMEOUT_MARGIN_S = 30.0
"""``episode.env_timeout_s`` = the latency cap + this."""
CALIBRATION = "sync_split_nolat"

TRL_FINDING = (
    "No TRL arm: trl 1.16's GRPOTrainer(environment_factory=...) cannot run this task on the "
    "demo model. (1) It refuses the model at construction: the environment's public methods "
    "become tools, and GRPOTrainer requires a chat template that renders a tool-calling "
    "conversation (trl.chat_template_utils.supports_tool_calling); the demo's template "
    '("{{ role }}: {{ content }}") drops tool_calls, so the constructor raises \'The provided '
    "chat template does not support tool calling' (checked with a two-method environment on "
    "the cached demo model). (2) Past that, it parses tool calls only for the chat templates it "
    "knows (add_response_schema: Qwen, Llama 3, GLM, gpt-oss, ...), and raises 'Unrecognized "
    "chat template' for any other unless a response template is written for it. (3) Its "
    "episodes are a different task: TRL's environment speaks only through tool calls (reset(**row) "
    "may append text to the prompt; a model turn without a tool call ends the rollout; there "
    "is no step(message)), so ChainAddition's second question, a user message after a plain "
    "answer, would have to become the result of a tool such as answer(n), and the demo model, "
    "a character-level model warm-started on plain chat sums, writes no tool call: the two "
    "sides would train different tokens on different rewards, and no parity in the sense of "
    "benchmarks/vs_trl (same prompts, token ids, order, rewards, settings) can hold. A TRL arm "
    "needs a tool-calling model whose template TRL parses (Qwen2.5/3) and a task played "
    "through tool calls, not this benchmark's demo task."
)


def latency_env(median_s: float, p99_s: float, cap_s: float, seed: int) -> dict[str, str]:
    """The environment variables ``slow_env`` reads (checked: ``sigma_of`` raises on a p99
    below the median)."""
    slow_env.sigma_of(median_s, p99_s)
    return {slow_env.MEDIAN_VAR: repr(median_s), slow_env.P99_VAR: repr(p99_s),
            slow_env.CAP_VAR: repr(cap_s), slow_env.SEED_VAR: str(seed)}  # fmt: skip


def episode_overrides(cap_s: float, max_inflight: int) -> list[str]:
    """The task and the episodes' settings, the same in every arm."""
    return ["experiment=chain", f"episode.env={ENV_SPEC}", "episode.env_workers=1",
            f"episode.env_timeout_s={cap_s + TIMEOUT_MARGIN_S:g}",
            f"actor.max_inflight={max_inflight}"]  # fmt: skip


def all_arms(cores: list[int], staleness: list[int], admission: list[str]) -> dict[str, list[str]]:
    """Every arm's own overrides (``sync_vs_async.run.arm_overrides``: its pinning and mode),
    the calibration arm included."""
    arms = arm_overrides(cores, staleness, "threads", ("drop_group",), tuple(admission))
    arms[CALIBRATION] = list(arms["sync_split"])
    return arms


def chosen_arms(args: argparse.Namespace, cores: list[int]) -> dict[str, list[str]]:
    """The contestants: ``--arms`` in its order, else sync_split and every async arm of
    --staleness x --admission; an unknown name is refused, listing the arms."""
    arms = all_arms(cores, args.staleness, args.admission)
    if args.arms:
        wanted = args.arms.split(",")
    else:
        wanted = [a for a in arms if a not in ("sync_colocated", CALIBRATION)]
    unknown = [a for a in wanted if a not in arms or a == CALIBRATION]
    if unknown:
        known = [a for a in arms if a != CALIBRATION]
        raise SystemExit(f"unknown arms {unknown}; arms are {known}")
    return {a: arms[a] for a in wanted}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.multi_turn", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="task seeds (default 0 1)")
    p.add_argument("--steps", type=int, default=150, help="learner steps per run (default 150)")
    p.add_argument("--wall-s", type=float, default=0.0,
                   help="also stop each run after this many seconds of training "
                        "(learner.max_wall_s; 0 = steps only)")  # fmt: skip
    p.add_argument("--arms", help="comma-separated arms, in this order (default: sync_split and "
                   "every async arm of --staleness x --admission)")  # fmt: skip
    p.add_argument("--staleness", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--admission", nargs="+", default=["capacity"], choices=("capacity", "window"),
                   help="buffer.admission of the async arms: an arm per option (default capacity; "
                        "window adds async_s<k>_window)")  # fmt: skip
    p.add_argument("--latency-median-s", type=float, default=slow_env.DEFAULT_MEDIAN_S)
    p.add_argument("--latency-p99-s", type=float, default=slow_env.DEFAULT_P99_S)
    p.add_argument("--latency-cap-s", type=float,
                   help=f"longest delay (default {slow_env.CAP_P99S:g} x p99)")  # fmt: skip
    p.add_argument("--latency-seed", type=int, default=0,
                   help="the delays' seed (the same in every arm)")  # fmt: skip
    p.add_argument("--max-inflight", type=int, default=64, help="actor.max_inflight, every arm")
    p.add_argument("--eval-every", type=int,
                   help="validate every N versions (default steps // 5), besides start and end")  # fmt: skip
    p.add_argument("--metric", default="val/reward",
                   help="the validation value timed (val/reward, val/pass@1, val/exact)")  # fmt: skip
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.3, 0.45, 0.6],
                   help="levels of --metric to time")  # fmt: skip
    p.add_argument("--calibration-steps", type=int, default=20,
                   help="steps of the no-latency calibration arm (first seed)")  # fmt: skip
    p.add_argument("--no-calibration", action="store_true",
                   help="skip the calibration arm (then G and the bounds are not reported)")  # fmt: skip
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                   help="extra asyncrl override for every arm (repeatable)")  # fmt: skip
    p.add_argument("--reuse", action="store_true",
                   help="reuse finished runs in --runs-dir (resume, or re-report at other "
                        "thresholds without running anything)")  # fmt: skip
    p.add_argument("--keep-checkpoints", action="store_true")
    p.add_argument("--name", default="multi_turn", help="result name (default multi_turn)")
    p.add_argument("--out", type=Path, default=RESULTS, help="where the JSON, MD and PNGs go")
    p.add_argument("--runs-dir", type=Path, default=REPO / "runs" / "benchmarks",
                   help="where the runs' directories go (not committed)")  # fmt: skip
    args = p.parse_args(argv)
    args.latency_cap_s = args.latency_cap_s or round(slow_env.CAP_P99S * args.latency_p99_s, 6)
    args.eval_every = args.eval_every or max(1, args.steps // 5)
    return args


def _check_timeout(overrides: list[str], cap_s: float) -> None:
    """Refuse a run whose ``episode.env_timeout_s`` (after --set) is not above the latency cap:
    its slowest delays would end episodes as ``env_timeout`` instead of being waited for."""
    from asyncrl.core.config.load import load_config

    timeout = load_config(overrides).episode.env_timeout_s
    if timeout <= cap_s:
        raise SystemExit(f"episode.env_timeout_s={timeout:g} is not above the latency cap "
                         f"{cap_s:g} s: raise it or lower --latency-cap-s")  # fmt: skip


def timeout_for(steps: int, wall_s: float, p99_s: float, cap_s: float, validations: int) -> float:
    """A run's limit: start-up, a slow synchronous step per step (a batch waits for its
    slowest episodes: a few p99s) or the wall budget, and each validation's slow tail."""
    per_step = 10.0 + 3.0 * p99_s
    train = min(steps * per_step, wall_s + 60.0) if wall_s else steps * per_step
    return 900.0 + train + validations * (60.0 + 2.0 * cap_s)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    arms = chosen_arms(args, cores)
    calib = all_arms(cores, args.staleness, args.admission)[CALIBRATION]
    episodes = episode_overrides(args.latency_cap_s, args.max_inflight)
    budget = [f"learner.steps={args.steps}"] + (
        [f"learner.max_wall_s={args.wall_s:g}"] if args.wall_s else []
    )
    evals = ["eval.at_start=true", "eval.at_end=true", f"eval.every={args.eval_every}"]
    common = [*episodes, *budget, *evals, "learner.checkpoint_every=0", "metrics_port=0",
              *args.extra]  # fmt: skip
    calib_common = [*episodes, f"learner.steps={args.calibration_steps}", "eval.at_start=false",
                    "eval.at_end=false", "eval.every=0", "learner.checkpoint_every=0",
                    "metrics_port=0", *args.extra]  # fmt: skip
    _check_timeout(common, args.latency_cap_s)
    split = core_split(cores)
    validations = 2 + args.steps // args.eval_every
    timeout_s = timeout_for(args.steps, args.wall_s, args.latency_p99_s, args.latency_cap_s,
                            validations)  # fmt: skip
    print(f"[multi_turn] cores {cpulist(cores)}: split arms learner on "
          f"{cpulist(split['learner'])}, actor on {cpulist(split['actor'])}; latency median "
          f"{args.latency_median_s:g} s, p99 {args.latency_p99_s:g} s, cap "
          f"{args.latency_cap_s:g} s; arms {', '.join(arms)}", flush=True)  # fmt: skip
    work = args.runs_dir / args.name
    runs: list[dict] = []

    def one(arm: str, seed: int, overrides: list[str], env: dict, limit: float) -> None:
        overrides = [*overrides, f"task.seed={seed}"]
        run_dir = work / f"{arm}-seed{seed}"
        print(f"[multi_turn] {arm} seed {seed}: asyncrl run {' '.join(overrides)}", flush=True)
        done = (run_dir / "summary.json").is_file() and list(run_dir.glob("actor*.json"))
        if args.reuse and done:
            r = load_run(arm, overrides, run_dir)  # its env from its bench_run.json
        else:
            r = run_arm(arm, overrides, run_dir, limit, args.keep_checkpoints, env)
        r["seed"] = seed
        _say_done(r)
        runs.append(r)

    lat = latency_env(args.latency_median_s, args.latency_p99_s, args.latency_cap_s,
                      args.latency_seed)  # fmt: skip
    if not args.no_calibration:
        none = latency_env(0.0, 0.0, 0.0, args.latency_seed)
        one(CALIBRATION, args.seeds[0], [*calib_common, *calib], none,
            900.0 + 30.0 * args.calibration_steps)  # fmt: skip
    for seed in args.seeds:
        for arm, own in arms.items():
            one(arm, seed, [*common, *own], lat, timeout_s)
    config = {
        "task": "experiment=chain (asyncrl/actors/data/chain.py ChainAddition, the demo model)",
        "env": ENV_SPEC,
        "latency": {**slow_env.latency_params(lat), "distribution": "lognormal, capped",
                    "env_vars": lat},
        "steps": args.steps, "wall_s": args.wall_s, "seeds": args.seeds,
        "staleness": args.staleness, "admission": args.admission, "arms": arms,
        "calibration": None if args.no_calibration else {
            "arm": CALIBRATION, "steps": args.calibration_steps, "seed": args.seeds[0],
            "overrides": [*calib_common, *calib]},
        "common_overrides": common, "max_inflight": args.max_inflight,
        "eval_every": args.eval_every, "metric": args.metric, "thresholds": args.thresholds,
        "env_timeout_s": args.latency_cap_s + TIMEOUT_MARGIN_S,
        "run_timeout_s": timeout_s, "cores": cores, "core_split": split,
        "seed_meaning": "task.seed (prompt stream, and so the delays); model seed=0 in every run",
        "trl": {"run": False, "why": TRL_FINDING},
    }  # fmt: skip
    _report(args, runs, config)
    return 0 if all(r["returncode"] == 0 for r in runs) else 1


def _report(args: argparse.Namespace, runs: list[dict], config: dict) -> None:
    from asyncrl.core.config.load import load_config

    cfg = load_config(config["common_overrides"])
    shape = {"batch_groups": cfg.learner.batch_groups, "n_samples": cfg.sampling.n_samples,
             "max_inflight": cfg.actor.max_inflight}  # fmt: skip
    config["shape"] = shape
    report = analyse(runs, list(config["arms"]), CALIBRATION, args.metric, args.thresholds,
                     config["latency"], shape)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    plots = plot_all(runs, report, args.out, args.name)
    table = markdown(report)
    payload = {"config": config, **report, "plots": plots, "runs": _slim(runs)}
    write_with_table(args.name, payload, table, args.out, "multi_turn")


def _say_done(r: dict) -> None:
    if r["returncode"]:
        print(f"[multi_turn]   FAILED (code {r['returncode']}); log: {r['log']}", flush=True)
        return
    s = r["summary"]
    print(f"[multi_turn]   done in {r.get('process_s', float('nan')):.0f} s: train "
          f"{s.get('train_wall_s', 0):.0f} s, {s['steps']} steps, reward "
          f"{s['reward_initial']:.3f} -> {s['reward_final']:.3f}, dropped stale "
          f"{s['groups_dropped_stale']}", flush=True)  # fmt: skip


_KEEP = ("step", "version", "elapsed_s", "reward", "step_s", "waiting_data_s", "busy_s",
         "weight_sync_s", "staleness_mean", "staleness_token_mean", "cpu_s", "groups",
         "response_len_mean", "response_len_p95", "length_bias", "reward/env_delay_s",
         "reward/env_steps", "reward/exact", "episode/turns_mean", "episode/end_done",
         "episode/end_length")  # fmt: skip


def _slim(runs: list[dict]) -> list[dict]:
    """Runs for the JSON: the per-step records cut to ``_KEEP``, the validations without
    their logged samples, machine paths relative to the repository."""
    out = []
    for r in runs:
        r = dict(r)
        r["records"] = [{k: rec.get(k) for k in _KEEP if k in rec} for rec in r.get("records", [])]
        for key in ("run_dir", "log"):
            if key in r:
                r[key] = _rel(Path(r[key]))
        out.append(r)
    return out


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return path.name


if __name__ == "__main__":
    sys.exit(main())
