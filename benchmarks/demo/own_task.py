"""Own-task runs with real vLLM and the demo model: do reward and validation reward rise, and
what does validation cost in training steps/s?

    python -m benchmarks.demo.own_task                    # -> results/own_task.{json,png}
    python -m benchmarks.demo.own_task --steps 60 --reps 1 --every 10

Each arm is one ``asyncrl run`` (the CLI, as a user runs it) on data written by
``examples/own_task/make_data.py`` (2000 train / 200 val prompts):

    parquet_verl   verl's parquet layout (chat messages, reward_model.ground_truth),
                   ``data=verl``, the verl-signature examples/own_task/reward.py:compute_score;
                   validation every ``--every`` steps, at start and at end, on
                   ``--val-prompts`` prompts x ``--val-samples`` samples (at the actors'
                   temperature; 1 = greedy); TensorBoard on
    jsonl_ours     JSON Lines of plain-text prompts, the asyncrl-signature
                   examples/own_task/reward_plain.py:score, validation as above
    cost_noeval    parquet_verl without validation: the steps/s baseline
    cost_eval      parquet_verl with the default greedy validation (``eval.n_samples=1``)
                   every ``--every`` steps: its steps/s over cost_noeval's is the cost

Arms run in turn ``--reps`` times (interleaved: drift on this shared machine hits each alike).
Per run: ``reward_initial`` / ``reward_final`` (summary.json: first 10% / last 20% of steps),
the validation curve (val.jsonl), and training steps/s = steps / ``train_wall_s`` (from the
moment the actors connected; validation at the end is after the last step and not in it).
The cost of validation is ``steps/s(cost_eval) / steps/s(cost_noeval)``, the mean over reps with
the per-rep ratios (and the same ratio of the learner's median per-step ``busy_s``). Threads: the launcher's defaults for 2 cores (learner 2
ranks x 1 thread, 1 actor x 1 thread, unpinned), recorded per run from its log.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, RESULTS, mean_std, write_result

EXAMPLE = "examples/own_task"
ARMS = ("parquet_verl", "jsonl_ours", "cost_noeval", "cost_eval")


def _data(tmp: Path) -> dict[str, Path]:
    out = {}
    for fmt in ("parquet", "jsonl"):
        d = tmp / fmt
        cmd = [sys.executable, f"{EXAMPLE}/make_data.py", str(d), "--format", fmt]
        subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
        out[fmt] = d
    return out


def _args(arm: str, data: dict[str, Path], args, run_dir: Path) -> list[str]:
    common = [f"learner.steps={args.steps}", f"run_dir={run_dir}", "metrics_port=0",
              f"seed={args.seed}"]  # fmt: skip
    val = [f"eval.every={args.every}", f"eval.max_prompts={args.val_prompts}"]
    if arm in ("parquet_verl", "jsonl_ours"):
        val += ["eval.at_start=true", "eval.at_end=true", f"eval.n_samples={args.val_samples}"]
    if arm == "jsonl_ours":
        d = data["jsonl"]
        return common + val + ["task=file", f"data.train_files=[{d}/train.jsonl]",
                               f"data.val_files=[{d}/val.jsonl]",
                               f"task.reward_fn={EXAMPLE}/reward_plain.py:score"]  # fmt: skip
    d = data["parquet"]
    task = ["task=file", "data=verl", f"data.train_files=[{d}/train.parquet]",
            f"data.val_files=[{d}/val.parquet]", "data.max_prompt_length=64",
            f"task.reward_fn={EXAMPLE}/reward.py:compute_score"]  # fmt: skip
    if arm == "parquet_verl":
        return common + task + val + ["logger=[console,jsonl,tensorboard]"]
    return common + task + (val if arm == "cost_eval" else [])


def _run(arm: str, data, args, tmp: Path, rep: int) -> dict:
    run_dir = tmp / f"{arm}_{rep}"
    cmd = [
        sys.executable,
        "-m",
        "asyncrl.orchestration.cli",
        "run",
        *_args(arm, data, args, run_dir),
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.timeout_s,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))  # fmt: skip
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise RuntimeError(f"{arm} rep {rep} failed ({proc.returncode}):\n{tail}")
    summary = json.loads((run_dir / "summary.json").read_text())
    cores = next((ln for ln in proc.stdout.splitlines() if ln.startswith("[asyncrl] cores:")), "")
    val = summary.get("validation", [])
    return {
        "arm": arm,
        "rep": rep,
        "overrides": _args(arm, data, args, Path("RUN_DIR")),
        "wall_s": time.monotonic() - t0,
        "steps": summary["steps"],
        "train_wall_s": summary["train_wall_s"],
        "steps_per_s": summary["steps"] / summary["train_wall_s"],
        "reward_initial": summary["reward_initial"],
        "reward_final": summary["reward_final"],
        "validation": [{k: r[k] for k in r if k in VAL_KEYS} for r in val],
        "tensorboard_files": len(list((run_dir / "tensorboard").glob("events.*")))
        if (run_dir / "tensorboard").is_dir()
        else 0,
        "threads": cores,
        "reward_curve": [r["reward"] for r in _records(run_dir)],
        "busy_s": [r["busy_s"] for r in _records(run_dir)],
        "waiting_data_s": sum(r["waiting_data_s"] for r in _records(run_dir)),
    }


VAL_KEYS = ("step", "val/version", "val/reward", "val/pass@1", "val/acc", "val/seconds",
            "val/prompts", "val/complete", "val/response_length")  # fmt: skip


def _records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(ln) for ln in lines if ln.strip()]


def _report(runs: list[dict]) -> dict:
    by_arm = {a: [r for r in runs if r["arm"] == a] for a in ARMS}
    out = {}
    for arm, rs in by_arm.items():
        if not rs:
            continue
        out[arm] = {
            "steps_per_s": mean_std([r["steps_per_s"] for r in rs]),
            "reward_initial": mean_std([r["reward_initial"] for r in rs]),
            "reward_final": mean_std([r["reward_final"] for r in rs]),
        }
        vals = [r["validation"] for r in rs if r["validation"]]
        if vals:
            out[arm]["val_reward_first"] = mean_std([v[0]["val/reward"] for v in vals])
            out[arm]["val_reward_last"] = mean_std([v[-1]["val/reward"] for v in vals])
    pairs = list(zip(by_arm["cost_eval"], by_arm["cost_noeval"], strict=False))
    if pairs:
        ratios = [a["steps_per_s"] / b["steps_per_s"] for a, b in pairs]
        busy = [_median_busy(a) / _median_busy(b) for a, b in pairs]
        out["validation_steps_per_s_ratio"] = mean_std(ratios) | {"per_rep": ratios}
        out["validation_busy_s_ratio"] = mean_std(busy) | {"per_rep": busy}
    return out


def _median_busy(run: dict) -> float:
    """The median of the learner's per-step ``busy_s`` (compute, starved or not)."""
    import statistics

    return statistics.median(run["busy_s"])


def _plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    for r in runs:
        y = r["reward_curve"]
        k = max(1, len(y) // 10)
        smooth = [sum(y[max(0, i - k + 1) : i + 1]) / len(y[max(0, i - k + 1) : i + 1])
                  for i in range(len(y))]  # fmt: skip
        ax1.plot(smooth, label=f"{r['arm']} #{r['rep']}")
        if r["validation"]:
            v = r["validation"]
            ax2.plot([x["val/version"] for x in v], [x["val/reward"] for x in v], marker="o",
                     label=f"{r['arm']} #{r['rep']}")  # fmt: skip
    ax1.set(xlabel="step", ylabel="train reward (moving mean)", title="training reward")
    ax2.set(xlabel="weight version", ylabel="val/reward", title="validation reward")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--every", type=int, default=10, help="eval.every")
    p.add_argument("--val-prompts", type=int, default=64, help="eval.max_prompts")
    p.add_argument("--val-samples", type=int, default=4,
                   help="eval.n_samples of parquet_verl and jsonl_ours (1 = greedy)")  # fmt: skip
    p.add_argument("--reps", type=int, default=1, help="runs of each arm (interleaved)")
    p.add_argument("--cost-reps", type=int, default=3, help="runs of each cost arm")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--timeout-s", type=float, default=1800)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--name", default="own_task", help="results/<name>.{json,png}")
    args = p.parse_args()
    arms = args.arms.split(",")
    runs = []
    with tempfile.TemporaryDirectory(prefix="own_task_") as tmp:
        data = _data(Path(tmp))
        plan = [(rep, a) for rep in range(args.reps) for a in arms if not a.startswith("cost")]
        plan += [(rep, a) for rep in range(args.cost_reps) for a in arms if a.startswith("cost")]
        for rep, arm in plan:
            print(f"[own_task] {arm} rep {rep + 1}", flush=True)
            runs.append(_run(arm, data, args, Path(tmp), rep))
            r = runs[-1]
            print(f"[own_task]   reward {r['reward_initial']:.3f} -> {r['reward_final']:.3f},"
                  f" {r['steps_per_s']:.3f} steps/s, val "
                  f"{[round(v['val/reward'], 3) for v in r['validation']]}", flush=True)  # fmt: skip
    report = _report(runs)
    config = {
        k: getattr(args, k)
        for k in (
            "steps",
            "every",
            "val_prompts",
            "val_samples",
            "reps",
            "cost_reps",
            "seed",
            "arms",
        )
    }
    path = write_result(args.name, {"config": config, "report": report, "runs": runs}, args.out)
    _plot(runs, path.with_suffix(".png"))
    print(json.dumps(report, indent=2))
    print(f"[own_task] wrote {path} and {path.with_suffix('.png')}")


if __name__ == "__main__":
    main()
