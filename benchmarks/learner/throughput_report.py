"""The learner-throughput benchmark's report (``benchmarks.learner.throughput``): the stated
peak FLOPS behind MFU, per-arm figures from the workers' results with ratios against
``padded`` and ``bare`` and, per round, against each learner arm's own bare reference, the
default targets (or the preset's ``target_vs_bare``), the markdown tables, the result file and
its plot."""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.common import REPO, md_table, write_result

STATED_PEAKS = [  # (name must contain all of these, dense BF16 TFLOPS, source)
    (("H100", "HBM3"), 989.4, "NVIDIA H100 SXM5 datasheet: 1,979 BF16 TFLOPS with sparsity, "
     "989.4 dense"),
    (("H200",), 989.4, "NVIDIA H200 SXM datasheet: 1,979 BF16 TFLOPS with sparsity, 989.4 dense"),
]  # fmt: skip


def stated_peak(gpu: dict | None, flag: float | None) -> tuple[float | None, str]:
    """(peak TFLOPS, where it comes from); None when nothing honest can be said."""
    if flag:
        return flag, "--peak-tflops"
    if gpu is None:
        return None, "CPU: no stated peak FLOPS; pass --peak-tflops to compute MFU"
    for needles, tflops, source in STATED_PEAKS:
        if all(n in gpu["name"].upper() for n in needles):
            return tflops, source
    return None, (f"no stated dense BF16 peak for {gpu['name']!r} here (only H100 SXM and H200 "
                  "SXM); pass --peak-tflops")  # fmt: skip


def summarise(cfg: dict, runs: dict[str, list[dict]], counts: dict, real: int, peak) -> dict:
    """Per-arm figures, ratios against ``padded`` and ``bare``."""
    peak_tflops, peak_source = peak
    out = {}
    for arm, rs in runs.items():
        ok = [r for r in rs if r["status"] == "ok"]
        a = {**cfg["arms"][arm], "status": rs[0]["status"], "rounds": len(rs)}
        if ok:
            times = [t for r in ok for t in r["times_s"]]
            step = statistics.median(times)
            a |= {"step_s_median": step, "step_s_min": min(times), "step_s_all": times,
                  "warmup_s": [r["warmup_s"] for r in ok],
                  "real_tokens_per_s": real / step, "first_step": ok[0]["first_step"],
                  "layout": ok[0].get("layout")}  # fmt: skip
            a["real_tokens_per_s_per_round"] = [real / statistics.median(r["times_s"]) for r in ok]
            if prof := ok[0].get("profile"):  # the file's name only: no machine's path
                a["profile"] = {**prof, "path": Path(prof["path"]).name}
        else:
            a |= {"real_tokens_per_s": None, "error": rs[0].get("error")}
        tok_s = a["real_tokens_per_s"]
        if tok_s is not None and peak_tflops:
            a["mfu"] = 6 * counts["n_params"] * tok_s / (peak_tflops * 1e12)
        else:
            a["mfu"] = None
            a["mfu_null_reason"] = peak_source if tok_s is not None else "the step did not run"
        peaks = [r["peak_memory_mib"] for r in rs if r.get("peak_memory_mib") is not None]
        a["peak_memory_mib"] = max(peaks) if peaks else None
        a["memory_before_step_mib"] = ok[0].get("memory_before_step_mib") if ok else None
        out[arm] = a
    for ref in ("padded", "bare"):
        base = out.get(ref)
        for a in out.values():
            both = base and base["real_tokens_per_s"] and a["real_tokens_per_s"]
            a[f"tokens_per_s_vs_{ref}"] = (a["real_tokens_per_s"] / base["real_tokens_per_s"]
                                           if both else None)  # fmt: skip
            both = base and base["peak_memory_mib"] and a["peak_memory_mib"]
            a[f"peak_memory_vs_{ref}"] = (a["peak_memory_mib"] / base["peak_memory_mib"]
                                          if both else None)  # fmt: skip
    for name, a in out.items():
        a["vs_ref"] = _vs_ref(name, out)
    return out


def _resources(a: dict) -> tuple:
    """(compute dtype, gradient checkpointing, threads, cores) of an arm: what a fair
    reference must share (checkpointing recomputes the forward, so it changes the work)."""
    if a["kind"] == "bare":
        dtype, ckpt = a["settings"]["dtype"], a["settings"].get("checkpointing")
    else:
        keys = dict(o.split("=", 1) for o in a["overrides"])
        dtype, ckpt = keys.get("model.dtype"), keys.get("model.gradient_checkpointing")
    return dtype, str(ckpt).lower() == "true", a.get("threads"), a.get("cores")


def _vs_ref(name: str, arms: dict) -> dict | None:
    """A learner arm against its bare reference (the bare arm of the same dtype, checkpointing,
    threads and cores, else ``bare``): per-round ratios of real tokens/s and their median; None for a bare
    arm, or when either has no complete rounds."""
    a = arms[name]
    if a["kind"] == "bare":
        return None
    bares = [k for k, b in arms.items() if b["kind"] == "bare"]
    ref = next((k for k in bares if _resources(arms[k]) == _resources(a)),
               "bare" if "bare" in arms else None)  # fmt: skip
    mine = a.get("real_tokens_per_s_per_round")
    theirs = ref and arms[ref].get("real_tokens_per_s_per_round")
    if not mine or not theirs or len(mine) != len(theirs):
        return None
    ratios = [m / t for m, t in zip(mine, theirs, strict=True)]
    return {"ref": ref, "per_round": ratios, "median": statistics.median(ratios),
            "same_dtype_threads_cores": _resources(arms[ref]) == _resources(a)}  # fmt: skip


def targets(arms: dict, cfg: dict, real: int) -> list[dict]:
    """A preset's ``target_vs_bare`` (smollm2: every learner arm >= 0.9x its bare
    reference, median of per-round ratios) or else the default ones, where this run's arms can say:
    asyncrl >= 2x padded tokens/s at <= 1/3 of its peak memory (the CPU criterion), asyncrl
    >= 1.5x the bare loop (the GPU one)."""
    bound = cfg.get("target_vs_bare")
    if bound is not None:
        return [{"target": f"{name} >= {bound:g}x {a['vs_ref']['ref']}'s real tokens/s (median "
                           "of per-round ratios)", "value": a["vs_ref"]["median"],
                 "met": a["vs_ref"]["median"] >= bound}
                for name, a in arms.items() if a.get("vs_ref")]  # fmt: skip
    out = []
    a = arms.get("asyncrl", {})
    checks = [
        ("tokens_per_s_vs_padded", 2.0, ">=", "asyncrl >= 2x padded real tokens/s"),
        ("peak_memory_vs_padded", 1 / 3, "<=", "asyncrl peak memory <= 1/3 of padded"),
        ("tokens_per_s_vs_bare", 1.5, ">=", "asyncrl >= 1.5x the bare loop's tokens/s"),
    ]
    for key, bound, op, text in checks:
        v = a.get(key)
        if v is not None:
            out.append({"target": text, "value": v,
                        "met": v >= bound if op == ">=" else v <= bound})  # fmt: skip
    if cfg["device"] == "cuda":
        out.append({"target": "batch >= 100k real tokens", "value": real, "met": real >= 100_000})
    return out


def table(arms: dict) -> str:
    header = ["arm", "real tok/s", "x padded", "x bare", "MFU", "peak MiB", "x padded mem",
              "step s", "micro-batches", "padding", "largest fit (groups)"]  # fmt: skip
    rows = []
    for name, a in arms.items():
        fs = a.get("first_step") or {}
        fit = a.get("fit")
        if fit:
            fit_cell = f"{'>=' if fit['at_bound'] else ''}{fit['largest_groups']}"
        else:
            fit_cell = "skipped"
        mfu = a["mfu"]
        rows.append([name, a["real_tokens_per_s"] or a["status"], a["tokens_per_s_vs_padded"],
                     a["tokens_per_s_vs_bare"], f"{100 * mfu:.1f}%" if mfu is not None else None,
                     a["peak_memory_mib"], a["peak_memory_vs_padded"], a.get("step_s_median"),
                     fs.get("micro_batches"), fs.get("padding_frac"), fit_cell])  # fmt: skip
    return md_table(header, rows)


def rounds_table(arms: dict) -> str:
    """Real tokens/s of every arm in every round, and each learner arm's per-round ratio."""
    n = max((len(a.get("real_tokens_per_s_per_round") or []) for a in arms.values()), default=0)
    rows = []
    for name, a in arms.items():
        rates = a.get("real_tokens_per_s_per_round") or []
        v = a.get("vs_ref")
        rows.append([name, *(rates + [None] * (n - len(rates))),
                     f"{v['median']:.3f}x {v['ref']}" if v else None])  # fmt: skip
    return md_table(["arm", *(f"round {r + 1} tok/s" for r in range(n)), "vs ref (median)"], rows)


def plot(arms: dict, title: str, path: Path) -> None:
    """Real tokens/s per arm: each round a dot, the median a bar, the ratio to its reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * len(arms), 3.4))
    for x, a in enumerate(arms.values()):
        rates = a.get("real_tokens_per_s_per_round") or []
        ax.bar(x, a["real_tokens_per_s"] or 0, color="C1" if a["kind"] == "bare" else "C0")
        ax.plot([x] * len(rates), rates, "k.")
        if a.get("vs_ref"):
            top = max([a["real_tokens_per_s"], *rates])
            ax.annotate(f"{a['vs_ref']['median']:.2f}x {a['vs_ref']['ref']}", (x, top),
                        xytext=(0, 4), textcoords="offset points", ha="center", fontsize=8)  # fmt: skip
    ax.set_xticks(range(len(arms)), list(arms), rotation=20, fontsize=8)
    ax.set_ylabel("real tokens/s (prompt + completion)")
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def first_of(runs: dict[str, list[dict]], key: str):
    """``key`` of the first worker result that has it (``gpu``, ``threads``), else None."""
    return next((r[key] for rs in runs.values() for r in rs if key in r), None)


def library_versions() -> dict:
    import torch

    versions = {"torch": torch.__version__}
    for mod in ("transformers", "flash_attn", "hydra"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # not installed: say so
            versions[mod] = None
    return versions


def batch_facts(lengths: list[int], real: int) -> dict:
    """The measured batch: ``lengths`` are its rows' prompt + completion tokens."""
    return {"rows": len(lengths), "real_tokens": real, "width": max(lengths),
            "padded_tokens": len(lengths) * max(lengths),
            "row_len_mean": real / len(lengths), "row_len_max": max(lengths)}  # fmt: skip


def write_and_print(name: str, payload: dict, out: Path, quiet: bool = False) -> None:
    """``benchmarks.common.write_result``, then the table, the targets and where it went
    (``quiet``: where it went only)."""
    path = write_result(name, payload, out)
    if quiet:
        print(f"wrote {path.name} ({payload.get('partial')})", flush=True)
        return
    cfg = payload["config"]
    t = cfg["threads"]
    plot(payload["arms"], f"{cfg['real_model'] or cfg['preset'] or 'custom'} on {cfg['device']}, "
         f"{payload['batch']['rows']} rows, {payload['batch']['real_tokens']:,} real tokens; "
         f"{t['requested']} thread(s) a worker on cores {t['cores']}",
         path.with_suffix(".png"))  # fmt: skip
    print(payload["table_markdown"])
    print(payload["rounds_table_markdown"])
    for t in payload["targets"]:
        print(f"{'MET' if t['met'] else 'NOT MET'}: {t['target']} ({t['value']:.3g})")
    print(
        f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path} "
        f"({payload['wall_s']:.0f} s)"
    )
