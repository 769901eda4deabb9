"""Validation accuracy against wall-clock time for ``benchmarks/sync_vs_async/run.py`` (a real
model's runs, ``--setting smollm2``): when each arm's policy first reached each accuracy.

Definitions (every run; ``val`` are its val.jsonl records, ``records`` its metrics.jsonl):

- a point is a validation of version V: ``val/pass@1`` (greedy, the whole val set) at the time
  the learner produced V, ``elapsed_s`` of the metrics record whose ``version`` is V (version
  0 is time 0 and takes ``v0_pass1`` when the run did not validate it);
- ``train_s`` excludes validation where it blocks training: in ``mode=sync`` the learner
  waits for every validation before its next step, so the ``val/seconds`` of the earlier
  validations are subtracted; in async modes validation overlaps training and nothing is
  subtracted (its cost shows only as the actor's lost generation time);
- time to a threshold: the first point at or above it, on either clock; None if none is.

Per arm: means over seeds of the times, the final accuracy (mean, standard deviation, the
seeds' values) and the completion lengths of the trained samples (``response_len_mean``,
token-weighted over steps; ``response_len_p95``, the median over steps of each step's p95).
Verdicts: each async arm against the best synchronous arm (the one reaching the highest
threshold that every sync arm's seeds reached, soonest): speed-up at that threshold (target
>= 1.3x) and final accuracy within noise: the difference within twice its standard error,
from the seeds' spread and the validation's own binomial error (``sqrt(p (1 - p) / prompts)``
per run: 0.057 at pass@1 0.3 on 64 prompts).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from benchmarks.common import md_table, mean_std

SPEEDUP_TARGET = 1.3


def val_points(r: dict, v0_pass1: float | None) -> list[dict]:
    """``[{version, pass1, reward, length, elapsed_s, train_s}]`` sorted by version."""
    at = {int(x["version"]): x["elapsed_s"] for x in r["records"]}
    sync = "mode=sync" in r["overrides"]
    points, blocked = [], 0.0
    vals = sorted(r.get("val", []), key=lambda x: x["val/version"])
    if v0_pass1 is not None and not any(int(x["val/version"]) == 0 for x in vals):
        points.append({"version": 0, "pass1": v0_pass1, "reward": None, "length": None,
                       "elapsed_s": 0.0, "train_s": 0.0, "measured": False})  # fmt: skip
    for x in vals:
        v = int(x["val/version"])
        t = 0.0 if v == 0 else at.get(v)
        if t is None:
            continue
        points.append({"version": v, "pass1": x["val/pass@1"], "reward": x["val/reward"],
                       "length": x["val/response_length"], "elapsed_s": t,
                       "train_s": t - blocked, "measured": True})  # fmt: skip
        if sync:
            blocked += x.get("val/seconds", 0.0)
    return points


def first_at(points: list[dict], threshold: float, clock: str) -> float | None:
    return next((p[clock] for p in points if p["pass1"] >= threshold - 1e-9), None)


def run_val(r: dict, thresholds: list[float], v0_pass1: float | None) -> dict:
    pts = val_points(r, v0_pass1)
    recs = r["records"]
    tokens = sum(x["response_len_mean"] * x.get("groups", 1) for x in recs)
    weight = sum(x.get("groups", 1) for x in recs) or 1
    p95 = [x["response_len_p95"] for x in recs if "response_len_p95" in x]
    return {
        "seed": r["seed"],
        "points": pts,
        "final_pass1": pts[-1]["pass1"] if pts else None,
        "final_prompts": next(
            (
                x["val/prompts"]
                for x in reversed(sorted(r.get("val", []), key=lambda x: x["val/version"]))
                if "val/prompts" in x
            ),
            None,
        ),
        "final_version": pts[-1]["version"] if pts else None,
        "time_to": {str(t): first_at(pts, t, "elapsed_s") for t in thresholds},
        "train_time_to": {str(t): first_at(pts, t, "train_s") for t in thresholds},
        "val_seconds": sum(x.get("val/seconds", 0.0) for x in r.get("val", [])),
        "completion_len_mean": tokens / weight,
        "completion_len_p95": statistics.median(p95) if p95 else None,
    }


def _final_se(figs: list[dict]) -> float | None:
    """Standard error of an arm's mean final pass@1: the seeds' spread and each validation's
    binomial error over its prompts, whichever is larger."""
    finals = [f["final_pass1"] for f in figs if f["final_pass1"] is not None]
    if not finals:
        return None
    binom = [p * (1 - p) / n for f in figs if (n := f["final_prompts"]) and
             (p := f["final_pass1"]) is not None]  # fmt: skip
    within = math.sqrt(sum(binom)) / len(finals) if binom else 0.0
    spread = statistics.stdev(finals) / math.sqrt(len(finals)) if len(finals) > 1 else 0.0
    return max(within, spread)


def _times(figs: list[dict], key: str, t: float) -> dict:
    vals = [f[key][str(t)] for f in figs]
    return {**mean_std(vals), "reached": sum(v is not None for v in vals), "seeds": len(vals)}


def analyse_val(runs: list[dict], arms: list[str], thresholds: list[float],
                v0_pass1: float | None) -> dict:  # fmt: skip
    ok = [r for r in runs if r["returncode"] == 0 and r.get("records")]
    per_arm = {}
    for arm in arms:
        figs = [run_val(r, thresholds, v0_pass1) for r in ok if r["arm"] == arm]
        finals = [f["final_pass1"] for f in figs]
        per_arm[arm] = {
            "per_seed": figs,
            "time_to": {str(t): _times(figs, "time_to", t) for t in thresholds},
            "train_time_to": {str(t): _times(figs, "train_time_to", t) for t in thresholds},
            "final_pass1": {**mean_std(finals), "values": finals, "se": _final_se(figs)},
            "completion_len_mean": mean_std([f["completion_len_mean"] for f in figs]),
            "completion_len_p95": mean_std([f["completion_len_p95"] for f in figs]),
        }
    return {"thresholds": thresholds, "v0_pass1": v0_pass1, "arms": per_arm,
            "verdicts": verdicts(per_arm, thresholds)}  # fmt: skip


def _all_reached(a: dict, key: str, t: float) -> bool:
    x = a[key][str(t)]
    return x["seeds"] > 0 and x["reached"] == x["seeds"]


def best_sync(per_arm: dict, thresholds: list[float], key: str) -> tuple[str, float] | None:
    """(arm, threshold): the highest threshold every seed of some sync arm reached, and the
    sync arm that reached it soonest (mean over seeds)."""
    syncs = [a for a in per_arm if a.startswith("sync")]
    for t in sorted(thresholds, reverse=True):
        done = [a for a in syncs if _all_reached(per_arm[a], key, t)]
        if done:
            return min(done, key=lambda a: per_arm[a][key][str(t)]["mean"]), t
    return None


def verdicts(per_arm: dict, thresholds: list[float]) -> dict:
    out = {}
    for key in ("time_to", "train_time_to"):
        best = best_sync(per_arm, thresholds, key)
        if best is None:
            out[key] = {"note": "no synchronous arm reached any threshold in every seed"}
            continue
        ref, t = best
        ref_t = per_arm[ref][key][str(t)]["mean"]
        ref_final = per_arm[ref]["final_pass1"]
        arms = {}
        for arm, a in per_arm.items():
            if arm.startswith("sync"):
                continue
            got = a[key][str(t)]
            speedup = ref_t / got["mean"] if _all_reached(a, key, t) and got["mean"] else None
            fin = a["final_pass1"]
            noise = 2 * math.sqrt((fin["se"] or 0) ** 2 + (ref_final["se"] or 0) ** 2) or 0.05
            diff = None if fin["mean"] is None else fin["mean"] - ref_final["mean"]
            arms[arm] = {"speedup": speedup, "met": speedup is not None and speedup >= SPEEDUP_TARGET,
                         "final_diff": diff, "final_within_noise": diff is not None and
                         abs(diff) <= noise, "noise": noise}  # fmt: skip
        out[key] = {"best_sync": ref, "threshold": t, "best_sync_s": ref_t,
                    "target": f">= {SPEEDUP_TARGET}x sooner", "arms": arms}  # fmt: skip
    return out


def markdown_val(v: dict) -> str:
    ts = v["thresholds"]
    head = ["arm", *[f"time to {t} (s)" for t in ts], *[f"train time to {t}" for t in ts],
            "final pass@1", "completion len mean", "p95"]  # fmt: skip
    rows = []
    for arm, a in v["arms"].items():
        cell = lambda x: None if x["reached"] < x["seeds"] else x["mean"]  # noqa: E731
        rows.append([arm, *[cell(a["time_to"][str(t)]) for t in ts],
                     *[cell(a["train_time_to"][str(t)]) for t in ts],
                     a["final_pass1"]["mean"], a["completion_len_mean"]["mean"],
                     a["completion_len_p95"]["mean"]])  # fmt: skip
    lines = [md_table(head, rows)]
    for key, verdict in v["verdicts"].items():
        if "arms" not in verdict:
            lines.append(f"{key}: {verdict['note']}")
            continue
        for arm, x in verdict["arms"].items():
            sp = "not reached" if x["speedup"] is None else f"{x['speedup']:.2f}x"
            lines.append(f"{key}: {arm} vs {verdict['best_sync']} at pass@1 >= "
                         f"{verdict['threshold']}: {sp} ({'MET' if x['met'] else 'NOT MET'} "
                         f"{verdict['target']}); final {x['final_diff']:+.3f} "
                         f"({'within' if x['final_within_noise'] else 'outside'} noise "
                         f"{x['noise']:.3f})")  # fmt: skip
    return "\n".join(lines)


def plot_val(v: dict, out: Path, name: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (arm, a) in enumerate(v["arms"].items()):
        for j, f in enumerate(a["per_seed"]):
            xs = [p["elapsed_s"] / 60 for p in f["points"]]
            ys = [p["pass1"] for p in f["points"]]
            ax.plot(xs, ys, marker="o", color=f"C{i}", alpha=0.9 if j == 0 else 0.5,
                    label=arm if j == 0 else None)  # fmt: skip
    for t in v["thresholds"]:
        ax.axhline(t, color="grey", lw=0.5, ls=":")
    ax.set_xlabel("wall-clock minutes (validation included)")
    ax.set_ylabel("validation pass@1 (greedy)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    path = out / f"{name}_val.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def best_arms(runs: list[dict], arms: list[str], thresholds: list[float],
              v0_pass1: float | None) -> list[str]:  # fmt: skip
    """The best synchronous and the best asynchronous arm of ``runs``: by validation when a
    sync arm reached a threshold in every seed (``best_sync``; the async arm soonest there,
    else the one with the highest final accuracy), else by median step time."""
    val = analyse_val(runs, arms, thresholds, v0_pass1)
    syncs = [a for a in arms if a.startswith("sync")]
    asyncs = [a for a in arms if not a.startswith("sync")]
    best = best_sync(val["arms"], thresholds, "time_to")
    if best is None:

        def speed(arm):
            steps = [x["step_s"] for r in runs if r["arm"] == arm for x in r.get("records", [])]
            return statistics.median(steps) if steps else float("inf")

        return [a for a in (min(syncs, key=speed, default=None),
                            min(asyncs, key=speed, default=None)) if a]  # fmt: skip
    ref, t = best

    def rank(arm):
        a = val["arms"][arm]
        reached = _all_reached(a, "time_to", t)
        return (
            not reached,
            a["time_to"][str(t)]["mean"] if reached else -(a["final_pass1"]["mean"] or 0),
        )

    return [ref, *([min(asyncs, key=rank)] if asyncs else [])]
