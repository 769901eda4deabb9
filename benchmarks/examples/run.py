"""Run an example's recipe as its README line does, and write what it learned.

    python -m benchmarks.examples --experiment smollm2_tools        # ~70 min here
    python -m benchmarks.examples --experiment smollm2_math --seed 1
    python -m benchmarks.examples --experiment smollm2_tools --reuse  # re-report the last run

Runs ``asyncrl run experiment=<name> seed=<seed> run_dir=<work>/<name>_s<seed>`` (plus any
``--set`` overrides) with asyncrl's own defaults, so what it measures is what a user's command
does: on this 2-core machine the learner (1 rank, 1 thread) on core 0 and the vLLM actor
(1 thread) on core 1. Its console lines are echoed as they come and kept in ``<run>.log``.
Then it reads the run's ``metrics.jsonl``, ``val.jsonl``, ``summary.json`` and
``config.yaml`` and writes ``benchmarks/results/<name>_example.{json,md}`` and ``*_val.png``:
the validation table (reward, pass@1, tool-call rate, turns per version), the training reward
and tool-call rate per step with their first/last means, the wall time, the ledger, how
episodes ended, and the first and last validations' logged conversations (``report.py``).
The end-of-run checkpoint is removed once read (SmolLM2's is 2.2 GB with its optimizer).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.common import REPO, RESULTS, asyncrl_run, write_with_table
from benchmarks.examples.report import learning, markdown

PINNING = (
    "asyncrl run defaults: learner 1 rank x 1 thread on core 0, actor (vLLM, 1 thread) on core 1"
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.examples", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--experiment", required=True, help="a file in configs/experiment/")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="extra overrides (recorded in the result)")  # fmt: skip
    p.add_argument("--name", help="result name (default <experiment>_example)")
    p.add_argument("--work", type=Path, help="where the run goes (default: a temporary folder)")
    p.add_argument("--timeout-s", type=float, default=4 * 3600)
    p.add_argument("--reuse", action="store_true", help="read the run in --work, run nothing")
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(argv)


def overrides(args: argparse.Namespace) -> list[str]:
    if not (REPO / "configs" / "experiment" / f"{args.experiment}.yaml").is_file():
        raise SystemExit(
            f"--experiment {args.experiment}: no configs/experiment/{args.experiment}.yaml"
        )
    return [f"experiment={args.experiment}", f"seed={args.seed}", *args.set]


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the run as Ctrl-C does


def run(cmd: list[str], log: Path, timeout_s: float) -> int:
    """Run ``cmd`` from the repository root, its output echoed and kept in ``log``; killed
    (its whole process group) at ``timeout_s`` or on Ctrl-C/SIGTERM. Returns its exit code."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + timeout_s
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with open(log, "w") as out:
            for line in proc.stdout:
                out.write(line)
                print(line, end="", flush=True)
                if time.monotonic() > deadline:
                    print(f"examples: the run passed --timeout-s {timeout_s:.0f}; stopping it")
                    break
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait(timeout=120)
    except KeyboardInterrupt:
        print("examples: interrupted; stopping the run", flush=True)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
        raise


def read_run(run_dir: Path) -> dict:
    """What a finished run wrote."""

    def jsonl(name):
        path = run_dir / name
        return (
            [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
            if path.is_file()
            else []
        )

    return {"records": jsonl("metrics.jsonl"), "val": jsonl("val.jsonl"),
            "summary": json.loads((run_dir / "summary.json").read_text()),
            "config": yaml.safe_load((run_dir / "config.yaml").read_text()),
            "actors": [json.loads(p.read_text()) for p in sorted(run_dir.glob("actor*.json"))]}  # fmt: skip


def conversations(val: list[dict], per: int = 3) -> list[dict]:
    """The first ``per`` logged samples of the first and the last validation."""
    chosen = [v for i, v in enumerate(val) if i in (0, len(val) - 1)]
    return [
        {"version": int(v["val/version"]), "samples": v.get("samples", [])[:per]} for v in chosen
    ]


def _without_samples(summary: dict) -> dict:
    """``summary`` with its validations' logged samples left out (``conversations`` keeps some)."""
    val = [{k: v for k, v in r.items() if k != "samples"} for r in summary.get("validation", [])]
    return {**summary, "validation": val}


def plot(fig: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes = plt.subplots(1, 2, figsize=(10, 3.6))[1]
    table, curve = fig["validation"], fig["curve"]
    for key in ("val/reward", "val/pass@1", "val/tool_call_rate"):
        if any(key in r for r in table):
            axes[0].plot(
                [r["version"] for r in table], [r.get(key) for r in table], "o-", label=key
            )
    axes[0].set(xlabel="policy version", title="greedy validation", ylim=(0, 1))
    for key in ("reward", "episode/tool_call_rate"):
        if any(key in r for r in curve):
            axes[1].plot([r["step"] for r in curve], [r.get(key) for r in curve], label=key)
    axes[1].set(xlabel="learner step", title="training (sampled)", ylim=(0, 1))
    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    plt.suptitle(title, fontsize=9)
    plt.tight_layout()
    plt.savefig(path, dpi=110)
    plt.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    name = args.name or f"{args.experiment}_example"
    over = overrides(args)
    work = args.work or Path(tempfile.mkdtemp(prefix="asyncrl-example-"))
    run_dir = work / f"{args.experiment}_s{args.seed}"
    process_s = None
    if not args.reuse:
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        cmd = asyncrl_run(over, run_dir)
        print(f"examples: asyncrl run {' '.join(over)} (run_dir {run_dir})", flush=True)
        t0 = time.monotonic()
        code = run(cmd, work / f"{run_dir.name}.log", args.timeout_s)
        process_s = time.monotonic() - t0
        if code != 0:
            print(f"examples: the run failed (exit {code}); its log: {work / run_dir.name}.log")
            return 1
    got = read_run(run_dir)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    fig = learning(got["records"], got["val"], got["summary"])
    payload = {
        "experiment": args.experiment, "seed": args.seed, "overrides": over,
        "user_command": "asyncrl run " + " ".join(over), "pinning": PINNING,
        "process_s": process_s, **fig, "actors": got["actors"],
        "conversations": conversations(got["val"]), "summary": _without_samples(got["summary"]),
        "config": got["config"],
    }  # fmt: skip
    write_with_table(name, payload, markdown(name, fig), args.out, "examples")
    plot(fig, args.out / f"{name}_val.png", payload["user_command"])
    return 0
