"""Does the decoupled-PPO staleness correction matter? Reward curves on the CPU demo.

Runs ``asyncrl run`` once per (policy loss, seed) at the same ``buffer.max_staleness`` and
compares:

  decoupled_ppo  AReaL: trust region around pi_prox (the learner's weights at the step start),
                 behaviour weight min(pi_prox/pi_behave, is_cap) corrects for staleness
  bypass_ppo     "naive" asynchronous PPO (AReaL's baseline): the ratio is taken against
                 pi_behave, the stale sampler, so the clip both bounds the update and absorbs
                 the lag (no recompute, no importance weight)

Everything else is the ``grpo`` preset with ``algorithm.minibatches`` PPO updates per step.
Writes ``<out>/staleness_correction_s<max_staleness>.json`` (config, machine, commit, per-run curves and
summaries, via ``benchmarks.common.write_result``: machine, commit, command) and
the ``.png`` next to it. It takes roughly ``runs x (40 s + steps x 2 s)`` on 2 cores.

    python -m benchmarks.demo.staleness_correction --steps 80 --max-staleness 4 --seeds 0 1
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import REPO, RESULTS, md_table, mean_std, write_result

LOSSES = ("decoupled_ppo", "bypass_ppo")
CURVE_KEYS = (
    "reward", "staleness_mean", "staleness_token_mean", "is_ess", "is_weight_mean",
    "is_weight_max", "is_truncated_frac", "clip_frac_low", "clip_frac_high",
    "approx_kl_behave", "entropy", "groups_per_s", "wall_s",
)  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--max-staleness", type=int, default=4)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--losses", nargs="+", default=list(LOSSES))
    p.add_argument("--minibatches", type=int, default=2, help="PPO updates per step")
    p.add_argument("--extra", nargs="*", default=[], help="more overrides for every run")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--runs", type=Path, default=REPO / "runs" / "staleness_correction",
                   help="run directories (checkpoints, logs; not committed)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument(
        "--sync-reference",
        action="store_true",
        help="also run the first loss on-policy (mode=sync, max_staleness=0)",
    )
    p.add_argument("--reuse", action="store_true",
                   help="keep finished runs with identical overrides instead of re-running")  # fmt: skip
    return p.parse_args(argv)


def run_one(args, loss: str, seed: int, sync: bool = False) -> dict:
    """One ``asyncrl run`` (``sync``: the on-policy reference, mode=sync, max_staleness=0);
    returns its summary and per-step curves."""
    staleness = 0 if sync else args.max_staleness
    label = f"sync_{loss}" if sync else loss
    name = f"staleness{staleness}_{label}_seed{seed}"
    run_dir = args.runs / name
    overrides = [
        "algorithm=grpo", f"algorithm.policy_loss={loss}",
        f"algorithm.minibatches={args.minibatches}", f"mode={'sync' if sync else 'async'}",
        f"buffer.max_staleness={staleness}", f"learner.steps={args.steps}",
        "learner.checkpoint_every=0", f"seed={seed}", f"task.seed={seed}", f"run_dir={run_dir}",
        *args.extra,
    ]  # fmt: skip
    print(f"[bench] {name}: {' '.join(overrides)}", flush=True)
    t0 = time.monotonic()
    if not (args.reuse and _finished(run_dir, overrides)):
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd = [sys.executable, "-m", "asyncrl.orchestration.cli", "run", *overrides]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        (run_dir / "bench_overrides.json").write_text(json.dumps(overrides))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    curves = {k: [r.get(k) for r in records] for k in CURVE_KEYS}
    result = {
        "loss": label,
        "seed": seed,
        "overrides": overrides,
        "run_dir": str(run_dir.relative_to(REPO)) if run_dir.is_relative_to(REPO) else str(run_dir),
        "total_s": time.monotonic() - t0,
        "summary": summary,
        "curves": curves,
        "stats": run_stats(curves),
    }
    s = result["stats"]
    print(f"[bench] {name}: reward {s['reward_first_20pct']:.3f} -> {s['reward_last_20pct']:.3f}"
          f" (mean {s['reward_mean']:.3f}), staleness {s['staleness_mean']:.2f}", flush=True)  # fmt: skip
    return result


def _finished(run_dir: Path, overrides: list[str]) -> bool:
    """A complete earlier run of these overrides that resolved to today's config (``--reuse``;
    the config's defaults, e.g. the demo's learning rate, may have changed since)."""
    from asyncrl.core.config.load import config_to_json, load_config

    marker = run_dir / "bench_overrides.json"
    if not ((run_dir / "summary.json").is_file() and marker.is_file()):
        return False
    now = json.loads(config_to_json(load_config(overrides)))
    then = json.loads((run_dir / "config.json").read_text())
    return json.loads(marker.read_text()) == overrides and now == then


def _mean(xs: list) -> float:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else float("nan")


def run_stats(curves: dict) -> dict:
    """Window means of the curves (first / last 20% of steps, and all steps)."""
    n = len(curves["reward"])
    k = max(1, n // 5)
    out = {
        "reward_first_20pct": _mean(curves["reward"][:k]),
        "reward_last_20pct": _mean(curves["reward"][-k:]),
        "reward_mean": _mean(curves["reward"]),
    }
    for key in CURVE_KEYS[1:-2]:
        out[key] = _mean(curves[key])
    return out


def aggregate(results: list[dict]) -> dict:
    """Per loss: mean, std and n over seeds of each run statistic."""
    out = {}
    for loss in dict.fromkeys(r["loss"] for r in results):
        runs = [r["stats"] for r in results if r["loss"] == loss]
        out[loss] = {k: mean_std([s[k] for s in runs]) for k in runs[0]}
    return out


def table(by_loss: dict) -> str:
    keys = ["reward_first_20pct", "reward_last_20pct", "reward_mean", "staleness_mean",
            "is_ess", "is_truncated_frac", "clip_frac_low", "clip_frac_high", "approx_kl_behave"]  # fmt: skip
    rows = [
        [loss, *[s[k]["mean"] for k in keys], s["reward_mean"]["n"]] for loss, s in by_loss.items()
    ]
    return md_table(["loss", *keys, "seeds"], rows)


def smooth(xs: list[float], w: int) -> list[float]:
    out, acc = [], []
    for x in xs:
        acc.append(x)
        acc = acc[-w:]
        out.append(sum(acc) / len(acc))
    return out


def plot(results: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("reward", "reward (moving mean, 5 steps)"), ("clip_frac_low", "clip fraction low"),
              ("is_ess", "ESS of pi_prox/pi_behave (bypass: 1 by construction)"), ("staleness_mean", "staleness (versions)")]  # fmt: skip
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    colors = {"decoupled_ppo": "tab:blue", "bypass_ppo": "tab:red", "sync_decoupled_ppo": "gray"}
    for ax, (key, label) in zip(axes.flat, panels, strict=True):
        for r in results:
            ys = [y if y is not None else float("nan") for y in r["curves"][key]]
            ys = smooth(ys, 5) if key in ("reward", "clip_frac_low") else ys
            ax.plot(range(len(ys)), ys, color=colors.get(r["loss"]), alpha=0.85,
                    linestyle="-" if r["seed"] % 2 == 0 else "--",
                    label=f"{r['loss']} seed {r['seed']}")  # fmt: skip
        ax.set_title(label)
        ax.set_xlabel("learner step")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    results = [run_one(args, loss, seed) for seed in args.seeds for loss in args.losses]
    if args.sync_reference:
        results += [run_one(args, args.losses[0], seed, sync=True) for seed in args.seeds]
    by_loss = aggregate(results)
    payload = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "by_loss": by_loss,
        "table_md": table(by_loss),
        "runs": results,
    }
    out = write_result(f"staleness_correction_s{args.max_staleness}", payload, args.out)
    title = (f"demo, max_staleness={args.max_staleness}, {args.minibatches} PPO updates/step, "
             f"{args.steps} steps, seeds {args.seeds}")  # fmt: skip
    plot(results, out.with_suffix(".png"), title)
    print(payload["table_md"])
    print(f"[bench] wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
