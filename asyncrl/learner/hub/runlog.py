"""Per-step records: the console line, ``metrics.jsonl``, ``summary.json`` and ``reward.png``.

``summary.json`` fields: ``steps``, ``reward_initial`` (mean reward over the first 10% of
steps), ``reward_final`` (mean over the last 20%), ``max_trained_staleness``,
``groups_committed``, ``groups_trained``, ``groups_dropped_stale``,
``groups_dropped_invalid``, ``groups_dropped_poison``, ``groups_dropped_uniform``,
``groups_still_buffered`` (committed = trained + the four dropped + still buffered), ``wall_s``, ``mode``, ``max_staleness``,
and (learner/hub/hub.py) ``train_wall_s`` (from the moment every actor was connected),
``learner_time_s`` (seconds per state: starting, busy, waiting_data, weight_sync,
checkpoint), ``trained_staleness_histogram`` ({staleness: groups}), ``trained_totals``
(groups, samples, completion tokens), ``dropped_by_reason``, ``weight_sync`` (count, bytes,
seconds, failures, regroups), ``reward_errors`` over the trained samples (count, samples,
by_kind, first: asyncrl/learner/hub/reward_records.py ``RewardErrorTally``), ``ledger`` (did those counts
balance: ``balanced``, ``imbalance``, ``imbalanced_steps``, ``first_imbalance_step``,
``foreign_unread``, ``repairs``: buffer/ledger.py). ``metrics.jsonl`` records add per-step ``elapsed_s``,
``step_s``, ``busy_s``, ``waiting_data_s``, ``weight_sync_s``, ``checkpoint_s``, ``cpu_s``,
``ledger_imbalance``. ``summary.json`` ``validation`` lists the run's validations, as in
``val.jsonl`` (one record per validation: learner/hub/validation.py, with its ``samples``, the
texts whole); ``val.png`` plots them.
See docs/metrics.md. The same records go to the experiment trackers of ``logger``
(asyncrl/core/observe/trackers.py), and the summary's numbers at the end.
"""

from __future__ import annotations

import json
import math
from collections import deque
from pathlib import Path

from asyncrl.core.observe.trackers import step_metrics, summary_metrics
from asyncrl.core.runtime.rundir import write_atomic

_ETA_WINDOW = 20  # steps whose mean time predicts the rest
CONSOLE_TEXT_CHARS = 120
"""A sample's prompt and completion are shortened to about this many characters on the
console (``shorten``); val.jsonl and the trackers keep them whole."""


def window_mean(values: list[float], start_frac: float, end_frac: float) -> float:
    """Mean of ``values[floor(start*N) : ceil(end*N)]`` with at least one element."""
    n = len(values)
    if n == 0:
        return float("nan")
    lo = min(int(math.floor(start_frac * n)), n - 1)
    hi = max(int(math.ceil(end_frac * n)), lo + 1)
    part = values[lo:hi]
    return sum(part) / len(part)


class RunLog:
    """Appends one JSON record per step and prints a one-line summary of it.

    A resumed learner continues the same ``metrics.jsonl``: the records already there are
    loaded, so ``summary.json`` covers the whole run, and a step trained again after a resume
    (it was past the last checkpoint) replaces the earlier record of that step in
    ``records``. The file itself is append-only: it keeps both.

    ``trackers`` (asyncrl/core/observe/trackers.py) get every record, the summary, and are closed with
    the log; ``total_steps`` (learner.steps) gives the console line its progress and ETA.
    """

    def __init__(
        self, run_dir: str | Path, quiet: bool = False, total_steps: int = 0, trackers=()
    ) -> None:
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / "metrics.jsonl"
        self.records: list[dict] = _read_records(path)
        self._file = open(path, "a", buffering=1)
        if path.stat().st_size and not path.read_bytes().endswith(b"\n"):
            self._file.write("\n")  # end a line torn by a killed learner before appending
        self.quiet = quiet
        self.total_steps = total_steps
        self.trackers = list(trackers)
        self._step_s: deque[float] = deque(maxlen=_ETA_WINDOW)
        val_path = self.dir / "val.jsonl"
        self.val_records: list[dict] = _read_val(val_path)
        self._val_file = open(val_path, "a", buffering=1)
        # the latest validation reward (validation runs on some steps only)
        self.val_reward = next(
            (r["val/reward"] for r in reversed(self.val_records) if "val/reward" in r), None
        )

    def log(self, record: dict) -> None:
        _append_step(self.records, record)
        self._file.write(json.dumps(record) + "\n")
        self.val_reward = record.get("val/reward", self.val_reward)
        if "step_s" in record:
            self._step_s.append(record["step_s"])
        for tracker in self.trackers:
            tracker.log(step_metrics(record), record["step"])
        if not self.quiet:
            line = console_line(record, self.total_steps, self.eta_s(record), self.val_reward)
            print(line, flush=True)

    def log_val(self, record: dict) -> None:
        """One validation (learner/hub/validation.py): ``val.jsonl``, the trackers at its
        ``step``, and a console line; its ``samples`` (if any) whole to val.jsonl and the
        trackers (``Tracker.log_samples``), one shortened line each to the console."""
        self.val_records.append(record)
        self._val_file.write(json.dumps(record) + "\n")
        self.val_reward = record.get("val/reward", self.val_reward)
        metrics = {k: float(v) for k, v in record.items() if k.startswith("val/")}
        samples, version = record.get("samples", []), int(record["val/version"])
        for tracker in self.trackers:
            tracker.log(step_metrics(metrics), record["step"])
            if samples:
                tracker.log_samples(samples, version, record["step"])
        if not self.quiet:
            lines = [val_line(record)] + [sample_line(s, version) for s in samples]
            print("\n".join(lines), flush=True)

    def eta_s(self, record: dict) -> float | None:
        """Seconds to ``total_steps`` at the mean pace of the last steps (None: unknown)."""
        if not self.total_steps or not self._step_s:
            return None
        left = max(0, self.total_steps - record["step"] - 1)
        return left * sum(self._step_s) / len(self._step_s)

    def close(self, status: str = "FINISHED") -> None:
        """Close the files and end every tracker's run as ``status`` (``FINISHED``, ``FAILED``
        after a crash, ``KILLED``: asyncrl/core/observe/trackers.py ``CLOSE_STATUSES``). Every tracker is
        closed even if one fails (the first error is raised after); a second call does
        nothing (a crash while finishing closes again)."""
        if self._file.closed:
            return
        self._file.close()
        self._val_file.close()
        errors = []
        for tracker in self.trackers:
            try:
                tracker.close(status)
            except Exception as e:  # one tracker's failure must not leave the others open
                errors.append(e)
        if errors:
            raise errors[0]

    def write_summary(self, extra: dict) -> dict:
        rewards = [r["reward"] for r in self.records]
        summary = {
            "steps": len(self.records),
            "reward_initial": window_mean(rewards, 0.0, 0.1),
            "reward_final": window_mean(rewards, 0.8, 1.0),
            "max_trained_staleness": max((r["staleness_max"] for r in self.records), default=0),
            **extra,
            "validation": self.val_records,
        }
        write_atomic(self.dir / "summary.json", json.dumps(summary, indent=2), 0o644)
        last_step = self.records[-1]["step"] if self.records else 0
        for tracker in self.trackers:
            tracker.log_summary(summary_metrics(summary), last_step)
        plot_reward(self.records, self.dir / "reward.png", title=extra.get("title", ""))
        plot_validation(self.val_records, self.dir / "val.png", title=extra.get("title", ""))
        return summary


def _jsonl_dicts(path: Path, key: str) -> list[dict]:
    """The JSON objects with ``key`` in the lines of ``path`` (none if it is missing); a torn
    line, from a learner killed mid-write, is skipped."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and key in record:
            out.append(record)
    return out


def _read_records(path: Path) -> list[dict]:
    """The step records of an earlier learner of this run, in step order."""
    records: list[dict] = []
    for record in _jsonl_dicts(path, "step"):
        _append_step(records, record)
    return records


def _read_val(path: Path) -> list[dict]:
    """The validations an earlier learner of this run logged."""
    return _jsonl_dicts(path, "val/version")


def val_line(r: dict) -> str:
    """``validation v40 (step 41) | val/reward 0.612 | pass@1 0.45 | length 4.1 | 64 prompts
    in 3.2 s``."""
    parts = [f"validation v{r['val/version']:.0f} (step {r['step']})"]
    if "val/reward" in r:
        parts.append(f"val/reward {r['val/reward']:.3f}")
    parts += [f"{k[4:]} {r[k]:.3f}" for k in sorted(r) if k.startswith("val/pass@")]
    if "val/response_length" in r:
        parts.append(f"length {r['val/response_length']:.1f}")
    done = "" if r.get("val/complete", 1.0) else " (INCOMPLETE: timed out)"
    parts.append(f"{r['val/prompts']:.0f} prompts in {r['val/seconds']:.1f} s{done}")
    return " | ".join(parts)


def sample_line(s: dict, version: int) -> str:
    """``validation v40 prompt 0 | reward 1.000 | "12+34=" -> "46"``: the texts JSON-quoted
    (a newline shows as ``\\n``) and shortened by ``shorten``. It starts like the
    validation's line, which the launcher passes to the console
    (asyncrl/orchestration/launch/launcher.py ``show_progress``)."""
    prompt = json.dumps(shorten(s["prompt"]), ensure_ascii=False)
    completion = json.dumps(shorten(s["completion"]), ensure_ascii=False)
    where = f"validation v{version} prompt {s['index']} | reward {s['reward']:.3f}"
    return f"{where} | {prompt} -> {completion}"


def shorten(text: str, limit: int = CONSOLE_TEXT_CHARS) -> str:
    """``text`` if it has at most ``limit`` characters, else its first third and last two
    thirds of ``limit`` around `` ...[N chars]... `` (the end holds a prompt's question and a
    completion's answer)."""
    if len(text) <= limit:
        return text
    head, tail = limit // 3, limit - limit // 3
    return f"{text[:head]} ...[{len(text) - head - tail} chars]... {text[-tail:]}"


def _append_step(records: list[dict], record: dict) -> None:
    """Append ``record``, dropping the records it supersedes (steps trained again after a
    resume from a checkpoint older than them)."""
    while records and records[-1]["step"] >= record["step"]:
        records.pop()
    records.append(record)


def console_line(
    r: dict, total_steps: int = 0, eta_s: float | None = None, val_reward: float | None = None
) -> str:
    """``step   41 | 42/400 ETA 3m05s | reward 0.512 | loss 0.0123 | kl_behave 0.0011 |
    val_reward 0.600 | stale ... | dropped ...``: steps done (= the version) of
    ``total_steps``, the loss and the k3 KL of the behaviour policy to the trained one
    (``approx_kl_behave``) when the step reported them, the latest validation reward when
    there was one. Tests and users match ``^step +N |``: keep it first."""
    done = f"{r['version']}/{total_steps}" if total_steps else f"v{r['version']}"
    if eta_s is not None:
        done += f" ETA {format_duration(eta_s)}"
    parts = [f"step {r['step']:4d}", done, f"reward {r['reward']:.3f}"]
    if "loss" in r:
        parts.append(f"loss {r['loss']:.4g}")
    if "approx_kl_behave" in r:
        parts.append(f"kl_behave {r['approx_kl_behave']:.3g}")
    if val_reward is not None:
        parts.append(f"val_reward {val_reward:.3f}")
    parts += [
        f"stale max {r['staleness_max']} mean {r['staleness_mean']:.2f}",
        f"{r['groups_per_s']:.1f} groups/s {r['tokens_per_s']:.0f} tok/s",
        f"dropped stale {r['dropped_stale']} invalid {r['dropped_invalid']}",
    ]
    return " | ".join(parts)


def format_duration(seconds: float) -> str:
    """``59s``, ``3m05s``, ``2h07m``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def plot_reward(records: list[dict], path: Path, title: str = "") -> None:
    """Reward (per step and a moving average) against wall-clock seconds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not records:
        return
    t = [r["wall_s"] for r in records]
    y = [r["reward"] for r in records]
    k = max(1, len(y) // 20)
    smooth = [
        sum(y[max(0, i - k + 1) : i + 1]) / len(y[max(0, i - k + 1) : i + 1]) for i in range(len(y))
    ]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(t, y, alpha=0.35, label="batch mean")
    ax.plot(t, smooth, label=f"moving mean ({k} steps)")
    ax.set_xlabel("wall-clock seconds")
    ax.set_ylabel("reward")
    ax.set_title(title or "reward")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_validation(records: list[dict], path: Path, title: str = "") -> None:
    """Validation reward and pass@k against the weight version validated (no file when the
    run validated nothing)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [r for r in records if "val/reward" in r]
    if not records:
        return
    x = [r["val/version"] for r in records]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(x, [r["val/reward"] for r in records], marker="o", label="val/reward")
    for key in sorted({k for r in records for k in r if k.startswith("val/pass@")}):
        ax.plot(x, [r.get(key, float("nan")) for r in records], marker=".", alpha=0.7, label=key)
    ax.set_xlabel("weight version (learner steps)")
    ax.set_ylabel("validation")
    ax.set_title(f"validation: {title}" if title else "validation")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
