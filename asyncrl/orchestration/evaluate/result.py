"""An evaluation's result (``eval.json``) and its console summary, from the prompt records
(pure: tested on literal records).

A prompt record is actors/validation.py's: ``{"index": i, "rewards": [n], "lengths": [n],
"extras": {key: [n]}, "errors": k, "off_version": m}`` (+ ``"sample"`` for the first
``eval.log_samples`` prompts). The metrics are the learner's ``val/*`` (learner/hub/
validation.py ``summarize``: the unbiased pass@k estimator for k = 1, 2, 4, ... and n,
solved = reward >= ``eval.pass_threshold``) without the ``val/`` prefix. Invariants of the
file: ``reward`` is the mean of every ``per_prompt`` reward, ``prompts`` is
``len(per_prompt)``, and a failed reward call is a 0 in ``rewards`` counted in
``reward_errors`` (never left out).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncrl.learner.hub.validation import samples_of, summarize


@dataclass
class Outcome:
    """What the scoring loop (scoring.py) returns."""

    records: dict[int, dict]
    """Prompt index -> its record, for the prompts that finished."""
    size: int
    """Prompts in the validation set (``eval.max_prompts`` of it)."""
    seconds: float
    """From the first prompt submitted to the last record (or the stop)."""
    stopped: str = ""
    """'' = every prompt scored; ``timeout`` (``eval.timeout_s``) or ``interrupted``."""
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    """Failed reward calls by kind (``raised``, ``timeout``, ...: actors/rewards/calls.py)."""


def build_result(outcome: Outcome, cfg, about: dict) -> dict:
    """The ``eval.json`` document: ``about`` (model, checkpoint, version, adapter), the
    settings, the metrics (module docstring), every prompt's rewards and the logged samples."""
    e = cfg.eval
    records = [outcome.records[i] for i in sorted(outcome.records)]
    metrics = {k.removeprefix("val/"): v for k, v in summarize(records, e.pass_threshold).items()}
    n = e.n_samples
    return {
        **about,
        "task": cfg.task.name,
        "reward_fn": cfg.task.reward_fn,
        "val_files": list(cfg.data.val_files),
        "n_samples": n,
        "temperature": 0.0 if n == 1 else e.temperature,  # one sample is greedy
        "max_tokens": cfg.sampling.max_tokens,
        "pass_threshold": e.pass_threshold,
        "prompts": len(records),
        "prompts_total": outcome.size,
        "complete": not outcome.stopped and len(records) == outcome.size,
        "stopped": outcome.stopped or None,
        "reward": metrics.get("reward"),
        "pass@1": metrics.get("pass@1"),
        f"pass@{n}": metrics.get(f"pass@{n}"),
        "reward_errors": sum(r.get("errors", 0) for r in records),
        "reward_errors_by_kind": dict(sorted(outcome.errors_by_kind.items())),
        "seconds": round(outcome.seconds, 3),
        "metrics": metrics,
        "per_prompt": [_per_prompt(r) for r in records],
        "samples": samples_of(outcome.records, min(e.log_samples, outcome.size)),
    }


def _per_prompt(record: dict) -> dict:
    return {
        "index": record["index"],
        "rewards": record["rewards"],
        "lengths": record["lengths"],
        "errors": record.get("errors", 0),
    }


def summary_lines(result: dict) -> list[str]:
    """The console's summary of ``result`` (``build_result``), one line per fact."""
    n = result["n_samples"]
    how = "greedy" if n == 1 else f"{n} samples each at temperature {result['temperature']:g}"
    lines = [
        f"{result['prompts']}/{result['prompts_total']} prompts ({how}) in "
        f"{result['seconds']:.1f} s" + ("" if result["complete"] else " (INCOMPLETE)")
    ]
    if result["reward"] is not None:
        passes = f"pass@1 {result['pass@1']:.4f}"
        if n > 1:
            passes += f"   pass@{n} {result[f'pass@{n}']:.4f}"
        lines.append(
            f"mean reward {result['reward']:.4f}   {passes}   (solved: reward >= "
            f"{result['pass_threshold']:g})"
        )
    kinds = ", ".join(f"{k} {v}" for k, v in result["reward_errors_by_kind"].items())
    errors = result["reward_errors"]
    lines.append(
        f"reward errors: {errors}"
        + (f" ({kinds}); each scored 0 and is in the means" if errors else "")
    )
    for s in result["samples"]:
        lines.append(
            f"sample {s['index']}: {_short(s['prompt'])} -> {_short(s['completion'])}  "
            f"reward {s['reward']:.3f}"
        )
    return lines


def _short(text: str, limit: int = 80) -> str:
    """``text`` as a repr, cut to ``limit`` characters (the file keeps it whole)."""
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."
