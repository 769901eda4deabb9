"""Figures and the plot of ``benchmarks/vs_trl/run.py``.

A run is ``{"system", "seed", "startup_s", "steps": [{"step", "t_proc_s", "t_train_s",
"reward", "completion_tokens"}]}`` with one record per optimizer step. Definitions:

- start-up: from the benchmark spawning the process to the start of training (TRL:
  ``on_train_begin``; asyncrl: the origin of ``elapsed_s``, every actor connected). The first
  step's generation is inside training for both. ``t_proc_s`` counts from the spawn,
  ``t_train_s`` from the start of training; ``t_proc_s = startup_s + t_train_s``.
- moving mean: trailing mean of the per-step batch reward over ``window`` steps, defined from
  the ``window``-th step on (a shorter head would let a lucky first batch cross a threshold).
- time to a threshold: ``t_proc_s`` ("with start-up") and ``t_train_s`` ("without") of the
  first step whose moving mean is >= the threshold; None when the run never gets there.
- steps/s: steps / ``t_train_s`` of the last step (and / ``t_proc_s``: with start-up).
- reward initial / final: mean batch reward of the first / last ``window`` steps.
- completion length: mean over steps of the per-step mean and p95 of training completions
  (tokens, stop token included).
- validation (runs with a ``val`` list: the smollm2 setting): ``val/pass@1`` of the first and
  last validation, and for each of ``VAL_THRESHOLDS`` the ``t_proc_s`` (when its figures were
  known) and validated step of the first validation with ``val/pass@1`` >= it.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.common import mean_std

SYSTEMS = ("trl", "asyncrl")
VAL_THRESHOLDS = (0.1, 0.15, 0.2, 0.25, 0.3)
"""Greedy validation pass@1 levels (SmolLM2-135M-Instruct starts at ~0.14 on the math set)."""


def moving_mean(values: list[float], window: int) -> list[float | None]:
    out: list[float | None] = []
    for i in range(len(values)):
        out.append(None if i + 1 < window else sum(values[i + 1 - window : i + 1]) / window)
    return out


def run_figures(run: dict, thresholds: list[float], window: int) -> dict:
    steps = run["steps"]
    rewards = [s["reward"] for s in steps]
    mm = moving_mean(rewards, window)
    hits = {}
    for thr in thresholds:
        i = next((i for i, v in enumerate(mm) if v is not None and v >= thr), None)
        hits[str(thr)] = {
            "with_startup_s": None if i is None else steps[i]["t_proc_s"],
            "train_s": None if i is None else steps[i]["t_train_s"],
            "step": None if i is None else steps[i]["step"],
        }
    last = steps[-1]
    return {
        "steps": len(steps),
        "startup_s": run["startup_s"],
        "first_step_s": steps[0]["t_proc_s"],  # spawn to the first step's end
        "train_s": last["t_train_s"],
        "total_s": last["t_proc_s"],
        "steps_per_s": len(steps) / last["t_train_s"],
        "steps_per_s_with_startup": len(steps) / last["t_proc_s"],
        "reward_initial": sum(rewards[:window]) / len(rewards[:window]),
        "reward_final": sum(rewards[-window:]) / len(rewards[-window:]),
        "completion_tokens_mean": _mean([s.get("completion_tokens") for s in steps]),
        "completion_tokens_p95_mean": _mean([s.get("completion_tokens_p95") for s in steps]),
        "time_to_threshold": hits,
        **val_figures(run.get("val", [])),
    }


def val_figures(val: list[dict]) -> dict:
    """Validation figures of one run (module docstring); {} when it did not validate. A
    validation that timed out (asyncrl's ``val/complete`` 0: some prompts never came back) is
    counted in ``val_incomplete`` and left out."""
    done = [v for v in val if "val/pass@1" in v]
    val = sorted((v for v in done if v.get("val/complete", 1.0)), key=lambda v: v["step"])
    if not val:
        return {"val_incomplete": len(done)} if done else {}
    hits = {}
    for thr in VAL_THRESHOLDS:
        v = next((v for v in val if v["val/pass@1"] >= thr), None)
        hits[str(thr)] = {"t_proc_s": v and v["t_proc_s"], "step": v and v["step"]}
    return {"val_pass1_initial": val[0]["val/pass@1"], "val_pass1_final": val[-1]["val/pass@1"],
            "val_steps": [v["step"] for v in val], "val_incomplete": len(done) - len(val),
            "val_seconds_mean": _mean([v.get("val/seconds") for v in val]),
            "val_response_length_final": val[-1].get("val/response_length"),
            "time_to_val_pass1": hits}  # fmt: skip


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None and x == x]
    return sum(xs) / len(xs) if xs else None


def analyse(runs: list[dict], thresholds: list[float], window: int) -> dict:
    """Per run figures, per system mean/std over seeds, and asyncrl-vs-TRL ratios."""
    per_run = {(r["system"], r["seed"]): run_figures(r, thresholds, window) for r in runs}
    systems = {}
    for system in SYSTEMS:
        figs = [f for (s, _), f in per_run.items() if s == system]
        if not figs:
            continue
        agg = {k: mean_std([f[k] for f in figs]) for k in
               ("steps_per_s", "steps_per_s_with_startup", "startup_s", "first_step_s", "train_s", "total_s",
                "reward_initial", "reward_final", "completion_tokens_mean")}  # fmt: skip
        for k in (
            "completion_tokens_p95_mean",
            "val_pass1_initial",
            "val_pass1_final",
            "val_seconds_mean",
        ):
            if all(f.get(k) is not None for f in figs):
                agg[k] = mean_std([f[k] for f in figs])
        ttt = {}
        for thr in map(str, thresholds):
            hits = [f["time_to_threshold"][thr] for f in figs]
            reached = [h for h in hits if h["train_s"] is not None]
            ttt[thr] = {"reached": f"{len(reached)}/{len(hits)}",
                        "with_startup_s": mean_std([h["with_startup_s"] for h in reached]),
                        "train_s": mean_std([h["train_s"] for h in reached])}  # fmt: skip
        systems[system] = {**agg, "time_to_threshold": ttt}
    return {"per_run": [{"system": s, "seed": seed, **f} for (s, seed), f in per_run.items()],
            "systems": systems, "asyncrl_vs_trl": _compare(systems, thresholds),
            "verdicts": _verdicts(systems, thresholds)}  # fmt: skip


def _compare(systems: dict, thresholds: list[float]) -> dict:
    """asyncrl over TRL: steps/s ratio, and TRL's time to each threshold over asyncrl's (a
    speedup: > 1 = asyncrl got there sooner), only where every seed of both reached it."""
    if set(SYSTEMS) - set(systems):
        return {}
    a, t = systems["asyncrl"], systems["trl"]
    out = {"steps_per_s_ratio": _ratio(a["steps_per_s"], t["steps_per_s"]),
           "steps_per_s_with_startup_ratio": _ratio(a["steps_per_s_with_startup"],
                                                    t["steps_per_s_with_startup"]),
           "time_to_threshold_speedup": {}}  # fmt: skip
    for thr in map(str, thresholds):
        ta, tt = a["time_to_threshold"][thr], t["time_to_threshold"][thr]
        every = _all(ta["reached"]) and _all(tt["reached"])
        out["time_to_threshold_speedup"][thr] = {
            key: _ratio(tt[key], ta[key]) if every else None
            for key in ("with_startup_s", "train_s")
        }
    return out


def _all(reached: str) -> bool:
    k, n = reached.split("/")
    return k == n and n != "0"


def _ratio(num: dict, den: dict) -> float | None:
    if num["mean"] is None or not den["mean"]:
        return None
    return num["mean"] / den["mean"]


def _verdicts(systems: dict, thresholds: list[float]) -> list[str]:
    if set(SYSTEMS) - set(systems):
        return ["only one system ran: no comparison"]
    a, t = systems["asyncrl"], systems["trl"]
    ratio = a["steps_per_s"]["mean"] / t["steps_per_s"]["mean"]
    out = [f"asyncrl ran {ratio:.2f}x TRL's steps/s (training only; start-up excluded); "
           f"start-up {a['startup_s']['mean']:.0f} s vs TRL {t['startup_s']['mean']:.0f} s, "
           f"first step at {a['first_step_s']['mean']:.1f} s vs {t['first_step_s']['mean']:.1f} s"]  # fmt: skip
    for thr in map(str, thresholds):
        ta, tt = a["time_to_threshold"][thr], t["time_to_threshold"][thr]
        if not (_all(ta["reached"]) and _all(tt["reached"])):
            out.append(f"reward {thr}: reached by asyncrl in {ta['reached']} seeds, by TRL in "
                       f"{tt['reached']}: no time ratio")  # fmt: skip
            continue
        out.append(f"reward {thr}: " + "; ".join(
            f"{what} asyncrl {ta[key]['mean']:.0f} ± {ta[key]['std']:.0f} s vs TRL "
            f"{tt[key]['mean']:.0f} ± {tt[key]['std']:.0f} s ({_word(ta[key], tt[key])})"
            for key, what in (("with_startup_s", "with start-up"), ("train_s", "training only"))))  # fmt: skip
    return out


def _word(ours: dict, theirs: dict) -> str:
    """``1.60x, sooner``: TRL's mean time over asyncrl's; "sooner" on the means (the spread
    over seeds is printed beside them)."""
    speedup = theirs["mean"] / ours["mean"]
    return f"{speedup:.2f}x, {'sooner' if speedup > 1 else 'NOT sooner'}"


def plot(runs: list[dict], thresholds: list[float], window: int, path: Path) -> str:
    """Moving-mean reward against seconds since spawn (left) and since training began."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    colors = {"trl": "tab:orange", "asyncrl": "tab:blue"}
    styles = ["-", "--", ":", "-."]
    for r in runs:
        mm = moving_mean([s["reward"] for s in r["steps"]], window)
        pts = [(s, v) for s, v in zip(r["steps"], mm, strict=True) if v is not None]
        for ax, key in zip(axes, ("t_proc_s", "t_train_s"), strict=True):
            ax.plot([s[key] for s, _ in pts], [v for _, v in pts], color=colors[r["system"]],
                    linestyle=styles[r["seed"] % len(styles)], marker="." if len(pts) < 30 else None,
                    label=f"{r['system']} seed {r['seed']}")  # fmt: skip
    titles = {"seconds since the process was spawned": "start-up included",
              "seconds since training began": "training only"}  # fmt: skip
    for ax, (xlabel, title) in zip(axes, titles.items(), strict=True):
        for thr in thresholds:
            ax.axhline(thr, color="grey", linewidth=0.5, linestyle=":")
        ax.set(xlabel=xlabel, title=f"reward against wall-clock time, {title}")
    axes[0].set_ylabel(f"reward (moving mean over {window} steps)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)
