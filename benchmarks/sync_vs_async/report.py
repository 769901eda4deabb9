"""Figures, verdicts, table and plots for ``benchmarks/sync_vs_async/run.py``.

Definitions (every run; ``records`` are the learner's per-step lines of metrics.jsonl):

- clock: ``elapsed_s``, seconds since every actor was connected (engine start-up and model
  loading are excluded; they are the same in every arm).
- reward curve: batch-mean reward smoothed with a trailing mean of ``smooth_window(steps)``
  steps; time to target = ``elapsed_s`` of the first step whose smoothed reward >= target.
- step time: median ``step_s`` after the first 10% of steps (start-up transients).
- G, T: median per-step ``waiting_data_s`` (the learner waits for data; in sync_split
  that is the actor generating the batch) and median ``step_s - waiting_data_s`` (train +
  weight sync); reported for every arm ("wait / work per step"), the bound uses sync_split's.
- idle: learner = sum ``waiting_data_s`` / sum ``step_s``; actor = (waiting_weights +
  waiting_buffer + idle) / all non-starting time, from ``actor<i>.json``.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.common import md_table, mean_std

TARGET_FRACTION = 0.8  # auto target: 80% of the way from the start to the lowest run's peak
_ACTOR_IDLE = ("waiting_weights", "waiting_buffer", "idle")


def smooth_window(steps: int) -> int:
    return max(3, steps // 20)


def smoothed(rewards: list[float], k: int) -> list[float]:
    out = []
    for i in range(len(rewards)):
        part = rewards[max(0, i - k + 1) : i + 1]
        out.append(sum(part) / len(part))
    return out


def learned(rewards: list[float]) -> bool:
    """Did this run's reward rise beyond noise? Mean of the last fifth of the steps minus
    the first fifth must exceed two standard errors of that difference."""
    k = max(3, len(rewards) // 5)
    first, last = rewards[:k], rewards[-k:]
    if len(rewards) < 2 * k:
        return False
    sd = statistics.pstdev(first + last) or 1e-12
    return statistics.fmean(last) - statistics.fmean(first) > 2 * sd * (2 / k) ** 0.5


def auto_target(runs: list[dict]) -> tuple[float, bool]:
    """(target, learned): a level every run reaches (``TARGET_FRACTION`` of the way from the
    common start to the lowest run's peak of the smoothed curve). ``learned`` is False unless
    every run's reward rose beyond noise (``learned``): the time to target is then noise."""
    curves, starts, rose = [], [], []
    for r in runs:
        rewards = [x["reward"] for x in r["records"]]
        k = smooth_window(len(rewards))
        curves.append(smoothed(rewards, k))
        starts.append(sum(rewards[:k]) / k)
        rose.append(learned(rewards))
    start = statistics.fmean(starts)
    lowest_peak = min(max(c) for c in curves)
    if lowest_peak <= start:
        return lowest_peak, False
    return start + TARGET_FRACTION * (lowest_peak - start), all(rose)


def run_figures(r: dict, target: float) -> dict:
    recs, s = r["records"], r["summary"]
    rewards = [x["reward"] for x in recs]
    curve = smoothed(rewards, smooth_window(len(rewards)))
    hit = next((x["elapsed_s"] for x, v in zip(recs, curve, strict=True) if v >= target), None)
    steady = recs[len(recs) // 10 :] or recs
    elapsed = recs[-1]["elapsed_s"]
    totals = s.get("trained_totals", {})
    step_total = sum(x["step_s"] for x in recs) or 1.0
    actor_time = {}
    for a in r["actors"]:
        for k, v in a["time_s"].items():
            actor_time[k] = actor_time.get(k, 0.0) + v
    active = sum(v for k, v in actor_time.items() if k != "starting") or 1.0
    return {
        "time_to_target_s": hit,
        "train_wall_s": elapsed,
        "step_s_median": statistics.median(x["step_s"] for x in steady),
        "trained_samples_per_s": totals.get("samples", 0) / elapsed,
        "trained_tokens_per_s": totals.get("tokens", 0) / elapsed,
        "generated_tokens_per_s": sum(a["tokens_generated"] for a in r["actors"]) / active,
        "learner_idle_frac": sum(x["waiting_data_s"] for x in recs) / step_total,
        "actor_idle_frac": sum(actor_time.get(k, 0.0) for k in _ACTOR_IDLE) / active,
        "actor_time_s": actor_time,
        "learner_time_s": {
            k: sum(x[f"{k}_s"] for x in recs)
            for k in ("busy", "waiting_data", "weight_sync", "checkpoint")
        },
        "weight_sync_pause_learner_s": sum(x["weight_sync_s"] for x in recs),
        "weight_sync_pause_actor_s": sum(a["weight_sync_s"] for a in r["actors"]),
        "staleness_histogram": s.get("trained_staleness_histogram", {}),
        "dropped_stale": s["groups_dropped_stale"],
        "groups_committed": s["groups_committed"],
        "groups_trained": s["groups_trained"],
        "reward_initial": s["reward_initial"],
        "reward_final": s["reward_final"],
        # admission figures: trained / read completion tokens, trained / read mean length
        # (None: a run from before the learner counted reads)
        "trained_token_frac": s.get("trained_token_frac"),
        "length_bias": s.get("length_bias"),
        "tokens_masked_stale": s.get("trained_tokens_masked_stale"),
        # ... and against what the actors generated, groups left in the buffer at the end
        # included; completion lengths read and trained (None: runs from before they were kept)
        "trained_generated_token_frac": _trained_generated(s, r["actors"]),
        **_lengths(s.get("completion_lengths")),
        # rank 0 CPU seconds per second of non-waiting step time; well below 1 = starved by
        # other processes on the same cores (None: runs from before cpu_s was recorded)
        "learner_cpu_per_work_s": (
            sum(x["cpu_s"] for x in recs) / (step_total - sum(x["waiting_data_s"] for x in recs))
            if all("cpu_s" in x for x in recs)
            else None
        ),  # fmt: skip
        "G_s": statistics.median(x["waiting_data_s"] for x in steady),
        "T_s": statistics.median(x["step_s"] - x["waiting_data_s"] for x in steady),
    }


def _trained_generated(summary: dict, actors: list[dict]) -> float | None:
    generated = sum(a["tokens_generated"] for a in actors)
    trained = summary["trained_totals"]["tokens"] - summary.get("trained_tokens_masked_stale", 0)
    return trained / generated if generated else None


def _lengths(lengths: dict | None) -> dict[str, float | None]:
    """``len_<stat>_<read|trained>`` from summary.json's ``completion_lengths``."""
    return {
        f"len_{stat}_{side}": (lengths or {}).get(side, {}).get(stat)
        for side in ("read", "trained")
        for stat in ("mean", "p95")
    }


def analyse(runs: list[dict], arms: list[str], target: float | None) -> dict:
    ok = [r for r in runs if r["returncode"] == 0 and r.get("records")]
    learned = True
    if target is None and ok:
        target, learned = auto_target(ok)
    per_arm: dict[str, dict] = {}
    for arm in arms:
        figs = [run_figures(r, target) for r in ok if r["arm"] == arm]
        failed = [r["seed"] for r in runs if r["arm"] == arm and r["returncode"] != 0]
        per_arm[arm] = {"per_seed": figs, "failed_seeds": failed, **_aggregate(figs)}
    overlap = _overlap(per_arm)
    return {
        "target_reward": target,
        "target_auto": learned if target is not None else None,
        "arms": per_arm,
        "overlap": overlap,
        "verdicts": _verdicts(per_arm, overlap, learned),
    }


def _aggregate(figs: list[dict]) -> dict:
    keys = [k for k, v in (figs[0].items() if figs else []) if isinstance(v, (int, float))]
    agg = {k: mean_std([f[k] for f in figs]) for k in keys}
    agg["time_to_target_s"] = mean_std([f["time_to_target_s"] for f in figs])
    agg["reached_target"] = sum(f["time_to_target_s"] is not None for f in figs)
    hist: dict[str, int] = {}
    for f in figs:
        for k, n in f["staleness_histogram"].items():
            hist[k] = hist.get(k, 0) + n
    return {"mean": agg, "staleness_histogram": hist}


def _m(per_arm: dict, arm: str, key: str) -> float | None:
    return per_arm.get(arm, {}).get("mean", {}).get(key, {}).get("mean")


def _overlap(per_arm: dict) -> dict:
    """G and T from sync_split, the ideal bound, and what each arm achieved against it."""
    G, T = _m(per_arm, "sync_split", "G_s"), _m(per_arm, "sync_split", "T_s")
    base_step = _m(per_arm, "sync_split", "step_s_median")
    base_ttt = _m(per_arm, "sync_split", "time_to_target_s")
    out = {"G_s": G, "T_s": T, "bound": None, "speedup_vs_sync_split": {}}
    if G is None or T is None or not max(G, T):
        return out
    out["bound"] = (G + T) / max(G, T)
    for arm in per_arm:
        step = _m(per_arm, arm, "step_s_median")
        ttt = _m(per_arm, arm, "time_to_target_s")
        out["speedup_vs_sync_split"][arm] = {
            "throughput": base_step / step if step else None,
            "time_to_target": base_ttt / ttt if base_ttt and ttt else None,
        }
    return out


def _verdicts(per_arm: dict, overlap: dict, learned: bool) -> list[str]:
    """Plain sentences: is async faster than each sync arm, and where the time went."""
    out = []
    if not learned:
        out.append("Reward did not rise beyond noise in every run (last fifth of the steps vs "
                   "the first fifth, 2 standard errors): time to target and final reward "
                   "measure noise here; compare throughput (steps/s, samples/s) instead.")  # fmt: skip
    bound = overlap.get("bound")
    for arm in (a for a in per_arm if a.startswith("async")):
        step = _m(per_arm, arm, "step_s_median")
        if step is None:
            continue
        for base in ("sync_split", "sync_colocated"):
            b = _m(per_arm, base, "step_s_median")
            if b is None:
                continue
            ratio = b / step
            out.append(f"{arm} is {_compare(per_arm, arm, base, 'step_s_median')} {base} in "
                       f"steps/s: {ratio:.2f}x{_spread(per_arm, arm, base, 'step_s_median')}"
                       + (f" (ideal overlap bound {bound:.2f}x)" if base == "sync_split" and bound else ""))  # fmt: skip
            ttt, b_ttt = _m(per_arm, arm, "time_to_target_s"), _m(per_arm, base, "time_to_target_s")
            if learned and ttt and b_ttt:
                out.append(f"{arm} is {_compare(per_arm, arm, base, 'time_to_target_s')} {base} "
                           f"in time to the target reward: {b_ttt / ttt:.2f}x"
                           f"{_spread(per_arm, arm, base, 'time_to_target_s')}")  # fmt: skip
            if base == "sync_split" and bound and ratio > 1.05 * bound:
                out.append(
                    f"{arm} beats the overlap bound, so its per-step work was smaller than "
                    f"sync_split's: T (train + sync per step) {_m(per_arm, arm, 'T_s'):.3f} s vs "
                    f"{_m(per_arm, 'sync_split', 'T_s'):.3f} s. The runs saw different machine "
                    "load (see load_avg_1min_before in runs[]); treat the excess as noise."
                )
        out.append(
            f"{arm}: learner idle {100 * _m(per_arm, arm, 'learner_idle_frac'):.0f}%, actor idle "
            f"{100 * _m(per_arm, arm, 'actor_idle_frac'):.0f}%, weight-sync pause "
            f"{_m(per_arm, arm, 'weight_sync_pause_learner_s'):.1f}s (learner) / "
            f"{_m(per_arm, arm, 'weight_sync_pause_actor_s'):.1f}s (actor), dropped stale "
            f"{_m(per_arm, arm, 'dropped_stale'):.0f}"
        )
    return out


def _ratio_range(per_arm: dict, arm: str, base: str, key: str) -> tuple[float, float] | None:
    """(lowest, highest) of ``base / arm`` over every pairing of their seeds' ``key`` (a time:
    above 1 means ``arm`` is faster)."""
    a = [f[key] for f in per_arm[arm]["per_seed"] if f.get(key)]
    b = [f[key] for f in per_arm[base]["per_seed"] if f.get(key)]
    if not a or not b:
        return None
    return min(b) / max(a), max(b) / min(a)


def _compare(per_arm: dict, arm: str, base: str, key: str) -> str:
    """'faster than' only if every seed pairing is faster and the means differ by > 5%;
    'NOT faster than' if no pairing is faster; else the spread decides nothing."""
    ratio = _m(per_arm, base, key) / _m(per_arm, arm, key)
    lo, hi = _ratio_range(per_arm, arm, base, key) or (ratio, ratio)
    if lo > 1.0 and ratio > 1.05:
        return "faster than"
    if hi < 1.0 and ratio < 0.95:
        return "NOT faster than"
    if ratio > 1.05:
        return "faster on average, but not in every seed pairing (within the spread), than"
    if ratio < 0.95:
        return "slower on average, but not in every seed pairing (within the spread), than"
    return "on par with"


def _spread(per_arm: dict, arm: str, base: str, key: str) -> str:
    r = _ratio_range(per_arm, arm, base, key)
    n = min(len(per_arm[arm]["per_seed"]), len(per_arm[base]["per_seed"]))
    return f" (seed pairings {r[0]:.2f}x-{r[1]:.2f}x)" if r and n > 1 else ""


def _pm(per_arm: dict, arm: str, key: str, scale: float = 1.0, fmt: str = "{:.3g}") -> str:
    m = per_arm[arm]["mean"].get(key, {})
    if m.get("mean") is None:
        return "-"
    s = fmt.format(m["mean"] * scale)
    return s + (f" ± {fmt.format(m['std'] * scale)}" if m.get("n", 0) > 1 else "")


def markdown(report: dict) -> str:
    per_arm, ov = report["arms"], report["overlap"]
    header = ["arm", "time to target (s)", "speedup vs sync_split (steps/s)", "step (s)",
              "wait / work per step (s)",
              "trained samples/s", "trained tok/s", "actor idle %", "learner idle %",
              "weight-sync pause learner/actor (s)", "dropped stale", "staleness mean",
              "trained / read tokens", "trained / generated tokens", "length bias",
              "p95 length trained / read", "final reward"]  # fmt: skip
    rows = []
    for arm, a in per_arm.items():
        reached = a["mean"].get("reached_target", 0)
        n = len(a["per_seed"])
        sp = ov.get("speedup_vs_sync_split", {}).get(arm, {}).get("throughput")
        hist = a["staleness_histogram"]
        total = sum(hist.values()) or 1
        rows.append([
            arm + (f" (failed seeds {a['failed_seeds']})" if a["failed_seeds"] else ""),
            _pm(per_arm, arm, "time_to_target_s") + (f" ({reached}/{n} reached)" if reached < n else ""),
            f"{sp:.2f}x" if sp else "-",
            _pm(per_arm, arm, "step_s_median"),
            _pm(per_arm, arm, "G_s", fmt="{:.2f}") + " / " + _pm(per_arm, arm, "T_s", fmt="{:.2f}"),
            _pm(per_arm, arm, "trained_samples_per_s"),
            _pm(per_arm, arm, "trained_tokens_per_s", fmt="{:.0f}"),
            _pm(per_arm, arm, "actor_idle_frac", 100, "{:.0f}"),
            _pm(per_arm, arm, "learner_idle_frac", 100, "{:.0f}"),
            _pm(per_arm, arm, "weight_sync_pause_learner_s", fmt="{:.1f}") + " / "
            + _pm(per_arm, arm, "weight_sync_pause_actor_s", fmt="{:.1f}"),
            _pm(per_arm, arm, "dropped_stale", fmt="{:.0f}"),
            f"{sum(int(k) * v for k, v in hist.items()) / total:.2f}",
            _pm(per_arm, arm, "trained_token_frac", fmt="{:.3f}"),
            _pm(per_arm, arm, "trained_generated_token_frac", fmt="{:.3f}"),
            _pm(per_arm, arm, "length_bias", fmt="{:.3f}"),
            _pm(per_arm, arm, "len_p95_trained", fmt="{:.0f}") + " / "
            + _pm(per_arm, arm, "len_p95_read", fmt="{:.0f}"),
            _pm(per_arm, arm, "reward_final"),
        ])  # fmt: skip
    lines = [md_table(header, rows), ""]
    if ov.get("bound"):
        lines.append(f"sync_split per step: generation G = {ov['G_s']:.3f} s, training + "
                     f"weight sync T = {ov['T_s']:.3f} s; ideal overlap bound (G+T)/max(G,T) "
                     f"= {ov['bound']:.2f}x.")  # fmt: skip
    t = report["target_reward"]
    if t is not None:
        how = (
            "auto"
            if report["target_auto"] is not False
            else "auto; no learning signal beyond noise"
        )
        lines.append(f"Target reward {t:.4f} ({how}).")
    lines += [f"- {v}" for v in report["verdicts"]]
    return "\n".join(lines)


def plot_all(runs: list[dict], report: dict, out_dir: Path, name: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    arms = list(report["arms"])
    colors = {a: plt.cm.tab10(i % 10) for i, a in enumerate(arms)}
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4))
    seen = set()
    for r in (r for r in runs if r.get("records")):
        recs = r["records"]
        y = smoothed([x["reward"] for x in recs], smooth_window(len(recs)))
        label = None if r["arm"] in seen else r["arm"]
        seen.add(r["arm"])
        ax.plot([x["elapsed_s"] for x in recs], y, color=colors[r["arm"]], label=label, lw=1.2)
    if report["target_reward"] is not None:
        ax.axhline(report["target_reward"], color="gray", ls="--", lw=0.8, label="target")
    ax.set(xlabel="wall-clock seconds (since actors connected)", ylabel="reward (smoothed)",
           title="reward vs wall-clock")  # fmt: skip
    ax.legend(fontsize=8)
    paths.append(_save(fig, out_dir / f"{name}_reward.png"))

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, key, title in zip(axes, ("trained_samples_per_s", "trained_tokens_per_s"),
                              ("trained samples/s", "trained tokens/s"), strict=True):  # fmt: skip
        means = [report["arms"][a]["mean"].get(key, {}).get("mean") or 0 for a in arms]
        stds = [report["arms"][a]["mean"].get(key, {}).get("std") or 0 for a in arms]
        ax.bar(arms, means, yerr=stds, color=[colors[a] for a in arms])
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=30, labelsize=8)
    paths.append(_save(fig, out_dir / f"{name}_throughput.png"))

    fig, ax = plt.subplots(figsize=(7, 3.5))
    keys = sorted({int(k) for a in arms for k in report["arms"][a]["staleness_histogram"]})
    width = 0.8 / max(1, len(arms))
    for i, a in enumerate(arms):
        hist = report["arms"][a]["staleness_histogram"]
        total = sum(hist.values()) or 1
        xs = [k + (i - (len(arms) - 1) / 2) * width for k in keys]
        ax.bar(xs, [hist.get(str(k), 0) / total for k in keys], width, label=a, color=colors[a])
    ax.set(xlabel="staleness of trained groups (versions)", ylabel="fraction of groups",
           title="staleness histogram", xticks=keys)  # fmt: skip
    ax.legend(fontsize=8)
    paths.append(_save(fig, out_dir / f"{name}_staleness.png"))
    return paths


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path.name  # beside the JSON; no machine path in the result
