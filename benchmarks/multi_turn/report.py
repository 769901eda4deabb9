"""Figures, verdicts, table and plots for ``benchmarks/multi_turn/run.py`` (whose docstring
defines the overlap bound).

Per run (``records``: the learner's metrics.jsonl lines; ``summary``: summary.json; ``actors``:
actor<i>.json; ``val``: val.jsonl without its samples):

- everything ``benchmarks.sync_vs_async.report.run_figures`` reports (its ``G_s``/``T_s``, the
  median wait for data and the median rest of a step, are ``wait_s``/``work_s`` here: G is the
  generation time of run.py's docstring), with the clock ``elapsed_s`` (seconds since every
  actor connected) and the time to the auto target of the smoothed training reward;
- ``episodes_trained_per_s``: trained samples (one episode each) / the run's training wall
  time; ``episodes_generated_per_s``: the actors' episodes / their non-starting time;
- ``actor_idle_frac`` (as sync_vs_async: waiting for weights or the buffer, or idle, over the
  non-starting time), ``actor_waiting_env_frac`` (measured: groups in flight but none at the
  engine, every episode waiting for its environment: the actor's ``waiting_env`` state, over
  the non-starting time; 0 for a result written before that state existed) and
  ``engine_busy_frac_est`` = G x batches generated / the actors' non-starting time;
- ``token_staleness_histogram`` (summary.json ``trained_token_staleness_histogram``: trained
  model tokens by versions behind) beside the groups' ``staleness_histogram``;
- ``env_s_per_episode``, ``env_steps_per_episode``: the seconds an episode waited for its
  environment and its environment steps (``reward/env_delay_s``, ``reward/env_steps``, means
  over the steps weighted by their groups); ``episode_ends``: summary.json's ``episodes.by_end``.

Validation (``analyse_val``): a point is a validation of version V: the record's ``metric`` at
``elapsed_s`` of the metrics record of version V (version 0 at 0), and at ``train_s`` =
``elapsed_s`` less the earlier validations' ``val/seconds`` in mode=sync (there the learner
waits for each; in async modes validation overlaps training). Time to a threshold: the first
point at or above it.
"""

from __future__ import annotations

import math
import random
import re
import statistics
from pathlib import Path

from benchmarks.common import md_table, mean_std
from benchmarks.multi_turn import slow_env
from benchmarks.sync_vs_async.report import _pm, _save, auto_target, smooth_window, smoothed
from benchmarks.sync_vs_async.report import run_figures as sva_figures
from benchmarks.sync_vs_async.validation import _times

SPEEDUP_TARGET = 1.5
"""Issue 42: async reaches the best synchronous arm's final validation value this much sooner..."""
SEEDS_TARGET = 2
"""... on at least this many seeds."""
CLOCKS = ("elapsed_s", "train_s")


def _weighted(recs: list[dict], key: str) -> float | None:
    """Mean of ``key`` over the records that have it, weighted by their groups."""
    pairs = [(r[key], r.get("groups", 1)) for r in recs if r.get(key) is not None]
    weight = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / weight if weight else None


def run_figures(r: dict, target: float, G: float | None, batch_groups: int) -> dict:
    f = sva_figures(r, target)
    f["wait_s"], f["work_s"] = f.pop("G_s"), f.pop("T_s")
    recs, s, actors = r["records"], r["summary"], r["actors"]
    active = sum(v for k, v in f["actor_time_s"].items() if k != "starting") or 1.0
    generated = sum(a.get("groups_generated", a.get("committed", 0)) for a in actors)
    tokens = s.get("trained_token_staleness_histogram", {})
    total = sum(tokens.values())
    return {
        **f,
        "steps": len(recs),
        "episodes_trained_per_s": s["trained_totals"]["samples"] / f["train_wall_s"],
        "episodes_generated_per_s": sum(a.get("episodes", {}).get("episodes", 0) for a in actors)
        / active,  # fmt: skip
        "engine_busy_frac_est": G * generated / batch_groups / active if G else None,
        "actor_waiting_env_frac": f["actor_time_s"].get("waiting_env", 0.0) / active,
        "env_s_per_episode": _weighted(recs, "reward/env_delay_s"),
        "env_steps_per_episode": _weighted(recs, "reward/env_steps"),
        "token_staleness_histogram": tokens,
        "token_staleness_mean": (
            sum(int(k) * n for k, n in tokens.items()) / total if total else None
        ),
        "episode_ends": s.get("episodes", {}).get("by_end", {}),
    }


def _steady(recs: list[dict]) -> list[dict]:
    return recs[len(recs) // 10 :] or recs


def group_residence_s(latency: dict, n: int, env_steps: float | None, draws: int = 2000) -> float:
    """R: the expected environment seconds of the slowest of a group's ``n`` episodes (each
    with 2 environment steps with probability ``env_steps - 1``, else 1), from slow_env's own
    delays (``delay_s`` with keys of their own)."""
    if not latency.get("median_s"):
        return 0.0
    p2 = min(1.0, max(0.0, (env_steps or 2.0) - 1.0))
    rng, total = random.Random(0), 0.0
    for g in range(draws):
        worst = 0.0
        for j in range(n):
            turns = 2 if rng.random() < p2 else 1
            worst = max(worst, sum(slow_env.delay_s(latency, f"mc|{g}|{j}|{t}")
                                   for t in range(turns)))  # fmt: skip
        total += worst
    return total / draws


def _bound_of(arm: str) -> int | None:
    m = re.match(r"async_s(\d+)", arm)
    return int(m.group(1)) if m else None


def _m(per_arm: dict, arm: str, key: str) -> float | None:
    return per_arm.get(arm, {}).get("mean", {}).get(key, {}).get("mean")


def overlap(per_arm: dict, G: float | None, latency: dict, shape: dict) -> dict:
    """G, E, T, the ideal bound and each async arm's bound with its admission cap, against the
    speed-up it achieved (run.py's docstring)."""
    W, T = _m(per_arm, "sync_split", "wait_s"), _m(per_arm, "sync_split", "work_s")
    S = _m(per_arm, "sync_split", "step_s_median")
    out = {"G_s": G, "W_s": W, "T_s": T, "E_s": None, "sync_step_s": S,
           "env_s_per_episode": _m(per_arm, "sync_split", "env_s_per_episode"),
           "R_s": None, "bound": None, "arms": {}}  # fmt: skip
    if S:
        for arm in per_arm:
            step = _m(per_arm, arm, "step_s_median")
            out["arms"][arm] = {"speedup_steps_per_s": S / step if step else None}
    if None in (G, W, T) or not max(G, T):
        return out
    B, n = shape["batch_groups"], shape["n_samples"]
    R = group_residence_s(latency, n, _m(per_arm, "sync_split", "env_steps_per_episode"))
    out.update({"E_s": W - G, "R_s": R, "bound": (W + T) / max(G, T)})
    for arm in per_arm:
        k = _bound_of(arm)
        if k is None:
            continue
        cap = min(shape["max_inflight"], B * max(1, k))
        little = B * R / cap
        out["arms"][arm].update({"inflight_cap_groups": cap, "little_s": little,
                                 "bound_k": (W + T) / max(G, T, little)})  # fmt: skip
    return out


# ---- validation -----------------------------------------------------------------------------


def val_points(r: dict, metric: str) -> list[dict]:
    """``[{version, value, elapsed_s, train_s}]`` of the run's validations, by version."""
    at = {int(x["version"]): x["elapsed_s"] for x in r["records"]}
    sync = "mode=sync" in r["overrides"]
    points, blocked = [], 0.0
    for x in sorted(r.get("val", []), key=lambda x: x["val/version"]):
        v = int(x["val/version"])
        t = 0.0 if v == 0 else at.get(v)
        if t is None or x.get(metric) is None:
            continue
        points.append({"version": v, "value": x[metric], "elapsed_s": t, "train_s": t - blocked,
                       "prompts": x.get("val/prompts")})  # fmt: skip
        if sync:
            blocked += x.get("val/seconds", 0.0)
    return points


def first_at(points: list[dict], level: float, clock: str) -> float | None:
    return next((p[clock] for p in points if p["value"] >= level - 1e-9), None)


def run_val(r: dict, metric: str, thresholds: list[float]) -> dict:
    pts = val_points(r, metric)
    last = pts[-1] if pts else {}
    return {
        "seed": r["seed"],
        "points": pts,
        "final": last.get("value"),
        "final_prompts": last.get("prompts"),
        "final_version": last.get("version"),
        "time_to": {str(t): first_at(pts, t, "elapsed_s") for t in thresholds},
        "train_time_to": {str(t): first_at(pts, t, "train_s") for t in thresholds},
        "val_seconds": sum(x.get("val/seconds", 0.0) for x in r.get("val", [])),
    }


def _final_se(figs: list[dict]) -> float | None:
    """Standard error of an arm's mean final value: the seeds' spread, or the largest a [0, 1]
    mean's can be (variance <= p (1 - p), over its prompts), whichever is larger."""
    finals = [f["final"] for f in figs if f["final"] is not None]
    if not finals:
        return None
    binom = [p * (1 - p) / f["final_prompts"] for f in figs
             if f["final_prompts"] and (p := f["final"]) is not None and 0 <= p <= 1]  # fmt: skip
    within = math.sqrt(sum(binom)) / len(finals) if binom else 0.0
    spread = statistics.stdev(finals) / math.sqrt(len(finals)) if len(finals) > 1 else 0.0
    return max(within, spread)


def analyse_val(runs: list[dict], arms: list[str], metric: str, thresholds: list[float]) -> dict:
    per_arm = {}
    for arm in arms:
        figs = [run_val(r, metric, thresholds) for r in runs if r["arm"] == arm]
        per_arm[arm] = {
            "per_seed": figs,
            "time_to": {str(t): _times(figs, "time_to", t) for t in thresholds},
            "train_time_to": {str(t): _times(figs, "train_time_to", t) for t in thresholds},
            "final": {
                **mean_std([f["final"] for f in figs]),
                "values": [f["final"] for f in figs],
                "se": _final_se(figs),
            },  # fmt: skip
        }
    return {"metric": metric, "thresholds": thresholds, "arms": per_arm,
            "verdicts": val_verdicts(per_arm)}  # fmt: skip


def val_verdicts(per_arm: dict) -> dict:
    """Issue 42's target per async arm, against the synchronous arm with the best mean final
    value: per seed, that seed's synchronous final value as the level, and how much sooner the
    async arm first reached it (on both clocks); met when >= ``SPEEDUP_TARGET`` on at least
    ``SEEDS_TARGET`` seeds with the final values within noise."""
    syncs = [a for a in per_arm if a.startswith("sync") and per_arm[a]["final"]["mean"] is not None]
    if not syncs:
        return {"note": "no synchronous arm has a validation"}
    ref = max(syncs, key=lambda a: per_arm[a]["final"]["mean"])
    ref_seeds = {f["seed"]: f for f in per_arm[ref]["per_seed"] if f["final"] is not None}
    ref_final = per_arm[ref]["final"]
    out: dict = {"best_sync": ref, "best_sync_final": ref_final["mean"],
                 "target": f">= {SPEEDUP_TARGET}x sooner on >= {SEEDS_TARGET} seeds, final "
                           "within noise", "arms": {}}  # fmt: skip
    for arm, a in per_arm.items():
        if arm.startswith("sync"):
            continue
        seeds = {}
        for f in a["per_seed"]:
            s = ref_seeds.get(f["seed"])
            if s is None:
                continue
            level, row = s["final"], {"level": s["final"]}
            for clock in CLOCKS:
                t_sync, t_arm = (
                    first_at(s["points"], level, clock),
                    first_at(f["points"], level, clock),
                )
                row[clock] = {"sync_s": t_sync, "arm_s": t_arm,
                              "speedup": t_sync / t_arm if t_sync and t_arm else None}  # fmt: skip
            seeds[str(f["seed"])] = row
        fin = a["final"]
        noise = 2 * math.sqrt((fin["se"] or 0) ** 2 + (ref_final["se"] or 0) ** 2) or 0.05
        diff = None if fin["mean"] is None else fin["mean"] - ref_final["mean"]
        within = diff is not None and abs(diff) <= noise
        met = {clock: sum((x[clock]["speedup"] or 0) >= SPEEDUP_TARGET for x in seeds.values())
               for clock in CLOCKS}  # fmt: skip
        out["arms"][arm] = {"per_seed": seeds, "seeds_met": met, "final_diff": diff,
                            "noise": noise, "final_within_noise": within,
                            "met": {c: within and met[c] >= SEEDS_TARGET for c in CLOCKS}}  # fmt: skip
    return out


# ---- the whole report -----------------------------------------------------------------------


def analyse(runs: list[dict], arms: list[str], calibration: str, metric: str,
            thresholds: list[float], latency: dict, shape: dict) -> dict:  # fmt: skip
    ok = [r for r in runs if r["returncode"] == 0 and r.get("records")]
    calib = next((r for r in ok if r["arm"] == calibration), None)
    G = statistics.median(x["waiting_data_s"] for x in _steady(calib["records"])) if calib else None
    contest = [r for r in ok if r["arm"] != calibration]
    target, learned = auto_target(contest) if contest else (None, False)
    B = shape["batch_groups"]
    per_arm: dict[str, dict] = {}
    for arm in arms:
        figs = [{"seed": r["seed"], **run_figures(r, target, G, B)}
                for r in contest if r["arm"] == arm]  # fmt: skip
        failed = [r["seed"] for r in runs if r["arm"] == arm and r["returncode"] != 0]
        per_arm[arm] = {"per_seed": figs, "failed_seeds": failed, **_aggregate(figs)}
    ov = overlap(per_arm, G, latency, shape)
    val = analyse_val(contest, arms, metric, thresholds)
    return {
        "target_reward": target,
        "target_learned": learned,
        "calibration": None if calib is None else {
            "arm": calibration, "G_s": G, "seed": calib["seed"],
            "figures": run_figures(calib, math.inf, G, B)},
        "arms": per_arm,
        "overlap": ov,
        "validation": val,
        "verdicts": _verdicts(per_arm, ov, val, learned),
    }  # fmt: skip


def _aggregate(figs: list[dict]) -> dict:
    keys = [k for k, v in (figs[0].items() if figs else []) if isinstance(v, int | float)]
    agg = {k: mean_std([f[k] for f in figs]) for k in keys if k != "seed"}
    agg["time_to_target_s"] = mean_std([f["time_to_target_s"] for f in figs])
    agg["reached_target"] = sum(f["time_to_target_s"] is not None for f in figs)
    hists = {}
    for key in ("staleness_histogram", "token_staleness_histogram", "episode_ends"):
        h: dict[str, int] = {}
        for f in figs:
            for k, n in f[key].items():
                h[k] = h.get(k, 0) + n
        hists[key] = h
    return {"mean": agg, **hists}


def _verdicts(per_arm: dict, ov: dict, val: dict, learned: bool) -> list[str]:
    out = []
    if not learned:
        out.append("The training reward did not rise beyond noise in every run (sync_vs_async's "
                   "test): time to the training-reward target measures noise.")  # fmt: skip
    if ov.get("bound"):
        out.append(f"Per synchronous step: G {ov['G_s']:.2f} s generation + E {ov['E_s']:.2f} s "
                   f"environment + T {ov['T_s']:.2f} s training; ideal overlap bound "
                   f"(G+E+T)/max(G,T) = {ov['bound']:.2f}x (an episode waits "
                   f"{ov['env_s_per_episode'] or 0:.2f} s for its environment on average; a "
                   f"group's slowest episode R = {ov['R_s']:.2f} s).")  # fmt: skip
    for arm, x in ov.get("arms", {}).items():
        if not arm.startswith("async") or x.get("speedup_steps_per_s") is None:
            continue
        cap = f" (its bound with the admission cap: {x['bound_k']:.2f}x)" if "bound_k" in x else ""
        out.append(f"{arm}: {x['speedup_steps_per_s']:.2f}x sync_split's steps/s{cap}; actor "
                   f"idle {100 * (_m(per_arm, arm, 'actor_idle_frac') or 0):.0f}%, dropped "
                   f"stale {_m(per_arm, arm, 'dropped_stale') or 0:.0f}, length bias "
                   f"{_m(per_arm, arm, 'length_bias') or float('nan'):.3f}")  # fmt: skip
    v = val.get("verdicts", {})
    for arm, x in v.get("arms", {}).items():
        for clock in CLOCKS:
            shown = ", ".join(_speedup_text(s[clock]) for s in x["per_seed"].values())
            out.append(f"{arm} vs {v['best_sync']} ({clock}): reached its final "
                       f"{val['metric']} per seed {shown or 'no seed'}; final {x['final_diff'] or 0:+.3f} "
                       f"({'within' if x['final_within_noise'] else 'outside'} noise "
                       f"{x['noise']:.3f}); target {'MET' if x['met'][clock] else 'NOT MET'}")  # fmt: skip
    return out


def _speedup_text(x: dict) -> str:
    if x["speedup"] is not None:
        return f"{x['speedup']:.2f}x"
    if x["sync_s"] == 0:
        return "nothing to time (the synchronous final was met at the start)"
    return "not reached" if x["arm_s"] is None else "sync never reached it"


def markdown(report: dict) -> str:
    per_arm, ov, val = report["arms"], report["overlap"], report["validation"]
    ts = val["thresholds"]
    header = ["arm", "steps/s vs sync_split", "bound", "step (s)", "wait / work (s)",
              "episodes/s trained", "episodes/s generated", "actor idle %", "waiting env %",
              "engine busy % (est)",
              "env s / episode", "token staleness mean", "dropped stale", "length bias",
              *[f"time to {val['metric']} {t} (s)" for t in ts], f"final {val['metric']}"]  # fmt: skip
    rows = []
    for arm in per_arm:
        x = ov.get("arms", {}).get(arm, {})
        sp, bk = x.get("speedup_steps_per_s"), x.get("bound_k")
        va = val["arms"].get(arm, {})
        times = []
        for t in ts:
            tt = va.get("time_to", {}).get(str(t), {})
            cell = "-" if not tt.get("reached") else f"{tt['mean']:.0f}"
            times.append(cell + (f" ({tt['reached']}/{tt['seeds']})"
                                 if tt and tt.get("reached", 0) < tt.get("seeds", 0) else ""))  # fmt: skip
        fin = va.get("final", {})
        rows.append([
            arm + (f" (failed seeds {per_arm[arm]['failed_seeds']})" if per_arm[arm]["failed_seeds"] else ""),
            f"{sp:.2f}x" if sp else "-",
            f"{bk:.2f}x" if bk else ("-" if arm.startswith("async") or not ov.get("bound") else f"{ov['bound']:.2f}x (ideal)"),
            _pm(per_arm, arm, "step_s_median"),
            _pm(per_arm, arm, "wait_s", fmt="{:.2f}") + " / " + _pm(per_arm, arm, "work_s", fmt="{:.2f}"),
            _pm(per_arm, arm, "episodes_trained_per_s"),
            _pm(per_arm, arm, "episodes_generated_per_s"),
            _pm(per_arm, arm, "actor_idle_frac", 100, "{:.0f}"),
            _pm(per_arm, arm, "actor_waiting_env_frac", 100, "{:.0f}"),
            _pm(per_arm, arm, "engine_busy_frac_est", 100, "{:.0f}"),
            _pm(per_arm, arm, "env_s_per_episode", fmt="{:.2f}"),
            _pm(per_arm, arm, "token_staleness_mean", fmt="{:.2f}"),
            _pm(per_arm, arm, "dropped_stale", fmt="{:.0f}"),
            _pm(per_arm, arm, "length_bias", fmt="{:.3f}"),
            *times,
            "-" if fin.get("mean") is None else f"{fin['mean']:.3f}" + (f" ± {fin['std']:.3f}" if fin.get("n", 0) > 1 else ""),
        ])  # fmt: skip
    lines = [md_table(header, rows), ""]
    lines += [f"- {v}" for v in report["verdicts"]]
    return "\n".join(lines)


# ---- plots ----------------------------------------------------------------------------------


def plot_all(runs: list[dict], report: dict, out_dir: Path, name: str) -> list[str]:
    """``<name>_val.png``, ``<name>_reward.png``, ``<name>_staleness.png`` (names beside the
    JSON, no machine path)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    arms = list(report["arms"])
    color = {a: plt.cm.tab10(i % 10) for i, a in enumerate(arms)}
    val, paths = report["validation"], []

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for arm in arms:
        for j, f in enumerate(val["arms"].get(arm, {}).get("per_seed", [])):
            pts = f["points"]
            ax.plot([p["elapsed_s"] / 60 for p in pts], [p["value"] for p in pts], marker="o",
                    color=color[arm], alpha=1.0 if j == 0 else 0.55, lw=1.2,
                    label=arm if j == 0 else None)  # fmt: skip
    for t in val["thresholds"]:
        ax.axhline(t, color="grey", lw=0.5, ls=":")
    ax.set(xlabel="wall-clock minutes since the actors connected (validation included)",
           ylabel=f"{val['metric']}", title="validation against wall-clock time")  # fmt: skip
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    paths.append(_save(fig, out_dir / f"{name}_val.png"))

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    seen = set()
    for r in runs:
        if r["arm"] not in color or not r.get("records"):
            continue
        recs = r["records"]
        y = smoothed([x["reward"] for x in recs], smooth_window(len(recs)))
        ax.plot([x["elapsed_s"] / 60 for x in recs], y, color=color[r["arm"]], lw=1.2,
                label=None if r["arm"] in seen else r["arm"])  # fmt: skip
        seen.add(r["arm"])
    if report["target_reward"] is not None:
        ax.axhline(report["target_reward"], color="grey", ls="--", lw=0.8, label="target")
    ax.set(xlabel="wall-clock minutes since the actors connected",
           ylabel="training reward (smoothed)", title="training reward against wall-clock time")  # fmt: skip
    ax.legend(fontsize=8)
    paths.append(_save(fig, out_dir / f"{name}_reward.png"))

    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    hists = {a: report["arms"][a]["token_staleness_histogram"] for a in arms}
    keys = sorted({int(k) for h in hists.values() for k in h}) or [0]
    width = 0.8 / max(1, len(arms))
    for i, a in enumerate(arms):
        total = sum(hists[a].values()) or 1
        xs = [k + (i - (len(arms) - 1) / 2) * width for k in keys]
        ax.bar(xs, [hists[a].get(str(k), 0) / total for k in keys], width, label=a, color=color[a])
    ax.set(xlabel="staleness of trained model tokens (versions behind)",
           ylabel="fraction of tokens", title="per-token staleness", xticks=keys)  # fmt: skip
    ax.legend(fontsize=8)
    paths.append(_save(fig, out_dir / f"{name}_staleness.png"))
    return paths
