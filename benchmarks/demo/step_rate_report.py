"""The report of ``benchmarks.demo.step_rate``: per-arm figures from the timed rounds (median
and fastest step, steps/s, and steps/s and CPU seconds against ``base``, paired by round), the
result file and its tables."""

from __future__ import annotations

import statistics
from pathlib import Path
from statistics import median

from benchmarks.common import REPO, RESULTS, md_table, write_result


def _quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def summarise(arms: list[dict], measured: dict, hashes: dict) -> dict:
    """Per arm: median and fastest step, steps/s, and steps/s against ``base``: each round's
    median step pairs with base's of the same round (median, quartiles, min, max over rounds),
    plus the pooled medians' ratio and the fastest steps' ratio."""
    base_rounds = [median(r) for r in measured["rounds"]["base"]]
    base_all = [t for r in measured["rounds"]["base"] for t in r]
    base_cpu = [median(r) for r in measured["cpu"]["base"]]
    out = {}
    for arm in arms:
        name = arm["name"]
        per_round = [median(r) for r in measured["rounds"][name]]
        every = [t for r in measured["rounds"][name] for t in r]
        step_s = median(every)
        ratios = [b / t for b, t in zip(base_rounds, per_round, strict=True)]
        q1, q3 = _quartiles(ratios)
        cpu_rounds = [median(r) for r in measured["cpu"][name]]
        cpu_ratios = [b / t for b, t in zip(base_cpu, cpu_rounds, strict=True)]
        c1, c3 = _quartiles(cpu_ratios)
        ready = measured["ready"][name]
        out[name] = {
            "checkout": arm["checkout"],
            "commit": hashes[arm["checkout"]],
            "overrides": arm["overrides"],
            "step_s_median": step_s,
            "step_s_min": min(every),
            "steps_per_s": 1.0 / step_s,
            "step_s_round_medians": per_round,
            "step_s_all": measured["rounds"][name],
            "steps_per_s_vs_base": {
                "median": median(ratios),
                "q1": q1,
                "q3": q3,
                "min": min(ratios),
                "max": max(ratios),
                "rounds": len(ratios),
                "rounds_slower": sum(r < 1 for r in ratios),
                "pooled": median(base_all) / step_s,
                "fastest_step": min(base_all) / min(every),
                "per_round": ratios,
            },
            "cpu_s_per_step_median": median([t for r in measured["cpu"][name] for t in r]),
            "cpu_s_all": measured["cpu"][name],
            "cpu_s_vs_base": {  # base's CPU seconds per step / the arm's: > 1 = less work
                "median": median(cpu_ratios),
                "q1": c1,
                "q3": c3,
                "min": min(cpu_ratios),
                "max": max(cpu_ratios),
                "per_round": cpu_ratios,
            },
            "learner_imported_from": _short_path(ready["learner_file"]),
            "world": ready["world"],
            "torch_threads_per_rank": ready["torch_threads"],
            "first_step": ready["first_step"],
        }
    return out


def _short_path(path: str) -> str:
    """``learner/__init__.py`` under which checkout, without machine-specific directories."""
    p = Path(path)
    if p.is_relative_to(REPO):
        return f"<working tree>/{p.relative_to(REPO)}"
    return f"<worktree>/{Path(*p.parts[-2:])}"


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def report(args, arms, results: dict, full: dict | None, extra: dict) -> None:
    """Write the result (``extra``: config, batch, round order, wall seconds, notes); print
    the tables."""
    name = args.name or ("demo_step_rate_full" if args.full else "demo_step_rate")
    payload = {"config": extra["config"], "batch": extra["batch"], "arms": results,
               "round_order": extra["order"], "full": full, "wall_s": extra["wall_s"],
               "notes": extra["notes"]}  # fmt: skip
    path = write_result(name, payload, Path(args.out) if args.out else RESULTS)
    header = ["arm", "checkout", "overrides", "median step s", "fastest step s", "steps/s",
              "steps/s vs base, per round: median [IQR] (min-max)", "rounds slower",
              "fastest vs base", "CPU s/step (ranks)", "CPU vs base: median [IQR]"]  # fmt: skip
    rows = []
    for arm in arms:
        r = results[arm["name"]]
        v, c = r["steps_per_s_vs_base"], r["cpu_s_vs_base"]
        rows.append([arm["name"], f"{arm['checkout']} `{r['commit'][:7]}`",
                     ",".join(arm["overrides"]) or "-", f"{r['step_s_median']:.4f}",
                     f"{r['step_s_min']:.4f}", f"{r['steps_per_s']:.2f}",
                     f"{v['median']:.3f} [{v['q1']:.3f}, {v['q3']:.3f}] "
                     f"({v['min']:.2f}-{v['max']:.2f})",
                     f"{v['rounds_slower']}/{v['rounds']}", f"{v['fastest_step']:.3f}",
                     f"{r['cpu_s_per_step_median']:.4f}",
                     f"{c['median']:.3f} [{c['q1']:.3f}, {c['q3']:.3f}]"])  # fmt: skip
    print(md_table(header, rows))
    if full:
        print()
        fr = [[r["checkout"], r["rep"], f"{r['steps_per_s']:.3f}", f"{r['train_wall_s']:.1f}",
               f"{r['learner_busy_s_per_step']:.3f}" if r["learner_busy_s_per_step"] else "-",
               _fmt(r["busy_s_median"]), _fmt(r["cpu_s_median"])]
              for r in full["runs"]]  # fmt: skip
        print(md_table(["whole demo", "rep", "steps/s", "train_wall_s", "learner busy s/step",
                        "median busy_s", "median cpu_s (rank 0)"], fr))  # fmt: skip
        ratios = ", ".join(f"{x:.3f}" for x in full["steps_per_s_new_vs_base"])
        print(f"whole demo steps/s new/base per pair: {ratios}")
    print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
