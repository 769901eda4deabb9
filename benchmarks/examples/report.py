"""What an example's run learned, from the files the run wrote (pure: no run, no I/O).

``learning(records, val, summary)`` -> the figures a user asks of an example: the validation
table (one row per validation: the version it ran on and its ``val/*`` keys), the training
curve (per step: reward, and for a multi-turn run the tool-call rate, turns and how episodes
ended), first and last means (the first 10% and the last 20% of steps, as ``summary.json``'s
``reward_initial``/``reward_final``), and how long it took (the learner's ``elapsed_s``).
"""

from __future__ import annotations

VAL_KEYS = ("val/reward", "val/pass@1", "val/tool_call_rate", "val/tool_calls", "val/turns",
            "val/truncated", "val/response_length", "val/prompts", "val/seconds")  # fmt: skip
STEP_KEYS = ("reward", "episode/tool_call_rate", "episode/tool_calls_mean", "episode/turns_mean",
             "episode/tool_errors_mean", "response/clip_ratio", "step_s", "elapsed_s")  # fmt: skip


def window_mean(values: list[float], lo: float, hi: float) -> float | None:
    """Mean of ``values[lo*n : max(hi*n, lo*n + 1)]`` (at least one value; None if empty)."""
    n = len(values)
    if not n:
        return None
    a = int(lo * n)
    part = values[a : max(int(hi * n), a + 1)]
    return sum(part) / len(part)


def validation_table(val: list[dict]) -> list[dict]:
    """One row per validation: ``version``, ``step`` and every ``VAL_KEYS`` the run wrote."""
    rows = []
    for v in val:
        row = {"version": int(v["val/version"]), "step": v.get("step")}
        row.update({k: v[k] for k in VAL_KEYS if k in v})
        rows.append(row)
    return rows


def training_curve(records: list[dict]) -> list[dict]:
    """Per step: ``step``, ``version`` and every ``STEP_KEYS`` the run wrote."""
    return [
        {"step": r["step"], "version": r.get("version"), **{k: r[k] for k in STEP_KEYS if k in r}}
        for r in records
    ]


def first_last(curve: list[dict], key: str) -> dict | None:
    """``{"first": mean of the first 10% of steps, "last": of the last 20%}`` of ``key``."""
    values = [row[key] for row in curve if row.get(key) is not None]
    if not values:
        return None
    return {"first": window_mean(values, 0.0, 0.1), "last": window_mean(values, 0.8, 1.0)}


def rise(table: list[dict], key: str) -> dict | None:
    """``key`` at the first and the last validation and whether it rose (None if absent)."""
    values = [row[key] for row in table if row.get(key) is not None]
    if len(values) < 2:
        return None
    return {
        "start": values[0],
        "end": values[-1],
        "best": max(values),
        "rose": values[-1] > values[0],
    }


def learning(records: list[dict], val: list[dict], summary: dict) -> dict:
    """The figures of one finished run (see the module docstring)."""
    table = validation_table(val)
    curve = training_curve(records)
    train = {k: first_last(curve, k) for k in ("reward", "episode/tool_call_rate")}
    return {
        "validation": table,
        "curve": curve,
        "val_rise": {k: rise(table, k) for k in ("val/reward", "val/pass@1", "val/tool_call_rate")},
        "train_first_last": {k: v for k, v in train.items() if v is not None},
        "wall_s": records[-1]["elapsed_s"] if records else None,
        "steps": len(records),
        "groups_trained": summary.get("groups_trained"),
        "groups_dropped_stale": summary.get("groups_dropped_stale"),
        "ledger_balanced": (summary.get("ledger") or {}).get("balanced"),
        "episodes": summary.get("episodes"),
    }


def markdown(name: str, fig: dict) -> str:
    """The result as a short Markdown table (written beside the JSON)."""
    cols = [k for k in ("val/reward", "val/pass@1", "val/tool_call_rate", "val/turns",
                        "val/response_length") if any(k in r for r in fig["validation"])]  # fmt: skip
    lines = [f"# {name}", "", "| version | step | " + " | ".join(cols) + " |",
             "|---|---|" + "---|" * len(cols)]  # fmt: skip
    for r in fig["validation"]:
        cells = [f"{r[k]:.3f}" if isinstance(r.get(k), float) else str(r.get(k, "-")) for k in cols]
        lines.append(f"| {r['version']} | {r['step']} | " + " | ".join(cells) + " |")
    lines.append("")
    for key, fl in fig["train_first_last"].items():
        lines.append(f"- training `{key}`: {fl['first']:.3f} (first 10% of steps) -> "
                     f"{fl['last']:.3f} (last 20%)")  # fmt: skip
    if fig["wall_s"] is not None:
        lines.append(f"- {fig['steps']} steps in {fig['wall_s'] / 60:.1f} min of learner wall time")
    return "\n".join(lines) + "\n"
