"""The learner-throughput benchmark's report (``benchmarks.learner_throughput``): the stated
peak FLOPS behind MFU, per-arm figures from the workers' results with ratios against
``padded`` and ``bare``, issue 15's targets, the markdown table and the result file."""

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
    return out


def targets(arms: dict, cfg: dict, real: int) -> list[dict]:
    """Issue 15's targets, where this run's arms can say: asyncrl >= 2x padded tokens/s at
    <= 1/3 of its peak memory (the CPU criterion), asyncrl >= 1.5x the bare loop (the GPU one)."""
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


def write_and_print(name: str, payload: dict, out: Path) -> None:
    """``benchmarks.common.write_result``, then the table, the targets and where it went."""
    path = write_result(name, payload, out)
    print(payload["table_markdown"])
    for t in payload["targets"]:
        print(f"{'MET' if t['met'] else 'NOT MET'}: {t['target']} ({t['value']:.3g})")
    print(
        f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path} "
        f"({payload['wall_s']:.0f} s)"
    )
