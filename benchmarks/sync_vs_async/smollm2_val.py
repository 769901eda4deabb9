"""The SmolLM2 comparison on one clock: validation pass@1 against wall-clock time for
every arm of ``sync_vs_async --setting smollm2`` and both sides of ``vs_trl --setting
smollm2``, read from their committed results (nothing is rerun).

    python -m benchmarks.sync_vs_async.smollm2_val                       # results/smollm2_val.{json,png}

Each point is a greedy validation of the 64 val prompts: its pass@1 when the run knew it,
seconds since the run's processes were spawned (``sync_vs_async``: ``elapsed_s``, from the
actors' start; ``vs_trl``: ``t_proc_s``, from the process spawn). ``time_to`` is the first
validation at or above each threshold per seed (None: not reached in 9 steps).

The two clocks start at different moments: ``sync_vs_async`` times from its actors' start,
``vs_trl`` from the process spawn (model load and engine start included). The same arm in both
(``async_s1`` and ``asyncrl_vs_trl_layout``: max_staleness 1, learner on core 0, actor on core
1, seed 0, the same validation scores) shows the offset: 608 s against 686 s. Only the two
sides of ``vs_trl`` share a clock; compare TRL with the ``sync_vs_async`` arms only through
that offset (``NOTE``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common import RESULTS, write_result

SVA = "sync_vs_async_smollm2.json"
TRL = "vs_trl_smollm2.json"
NOTE = (
    "sync_vs_async times from its actors' start, vs_trl from the process spawn: the same arm "
    "(async_s1 / asyncrl_vs_trl_layout, seed 0) reads 608 s against 686 s for the same "
    "validation; only vs_trl's two sides share a clock"
)


def curves(results: Path) -> dict[str, list[list[tuple[float, float]]]]:
    """``{arm: [per seed: [(seconds, pass@1), ...]]}`` from both result files."""
    out: dict[str, list] = {}
    sva = json.loads((results / SVA).read_text())
    for arm, a in sva["validation"]["arms"].items():
        for f in a["per_seed"]:
            pts = [(p["elapsed_s"], p["pass1"]) for p in f["points"] if p["measured"]]
            out.setdefault(arm, []).append(pts)
    trl = json.loads((results / TRL).read_text())
    for run in trl["runs"]:
        name = "trl" if run["system"] == "trl" else "asyncrl_vs_trl_layout"
        pts = [(v["t_proc_s"], v["val/pass@1"]) for v in run.get("val", [])]
        out.setdefault(name, []).append(pts)
    return out


def time_to(seeds: list[list[tuple[float, float]]], threshold: float) -> list[float | None]:
    """Per seed, the first validation's seconds with pass@1 >= ``threshold`` (None: never)."""
    return [next((t for t, p in pts if p >= threshold), None) for pts in seeds]


def plot(data: dict, thresholds: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    for i, (arm, seeds) in enumerate(data.items()):
        for j, pts in enumerate(seeds):
            ax.plot([t / 60 for t, _ in pts], [p for _, p in pts], marker="o",
                    color=f"C{i}", ls="-" if j == 0 else "--",
                    label=f"{arm} seed {j}")  # fmt: skip
    for t in thresholds:
        ax.axhline(t, color="grey", lw=0.5, ls=":")
    ax.set_xlabel("minutes since the run's processes started (validation included)")
    ax.set_ylabel("validation pass@1 (greedy, 64 prompts)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.sync_vs_async.smollm2_val", description=__doc__
    )
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.2, 0.25])
    p.add_argument("--results", type=Path, default=RESULTS, help="where both result files are")
    args = p.parse_args(argv)
    data = curves(args.results)
    table = {
        arm: {
            "final_pass1": [pts[-1][1] if pts else None for pts in seeds],
            "time_to_s": {str(t): time_to(seeds, t) for t in args.thresholds},
        }
        for arm, seeds in data.items()
    }
    plot(data, args.thresholds, args.results / "smollm2_val.png")
    write_result(
        "smollm2_val",
        {
            "config": {"thresholds": args.thresholds, "sources": [SVA, TRL]},
            "note": NOTE,
            "arms": table,
            "curves": data,
            "plots": ["smollm2_val.png"],
        },  # fmt: skip
        args.results,
    )
    for arm, row in table.items():
        print(f"{arm:24s} final {row['final_pass1']}  time to {row['time_to_s']}")


if __name__ == "__main__":
    main()
