"""A run resumed with another configuration: ``algorithm=rloo`` after grpo, or another
``learner.batch_groups``, silently mixed the two, and ``config.json`` was overwritten, so the
run directory no longer said what its first part had used.

Now, when ``run_dir`` already holds a ``config.json``:

- every part's config is kept: ``config-parts/part-<n>.json`` (n = 1, 2, ...), each with the
  version it started from (the newest checkpoint's, 0 if none) and what changed from the part
  before;
- a change of a key that changes what the run means (``MEANING``: the algorithm, the model, the
  batch, the sampling, the task and data) is refused unless ``allow_config_change=true``;
- every other change (steps, logging, timeouts, restarts, checkpoints, cores) is allowed.

Pure apart from ``record_part`` and ``check_resume`` (files) and ``resume_version`` (a
directory listing).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from asyncrl.core.config.job import Config
from asyncrl.core.config.load import config_to_json, migrate
from asyncrl.core.runtime.rundir import RunDirError

MEANING = (
    "algorithm.",
    "model.path",
    "model.dtype",
    "learner.batch_groups",
    "learner.lr",
    "learner.weight_decay",
    "sampling.",
    "episode.",
    "task.",
    "data.",
    "buffer.max_staleness",
    "mode.",
    "seed",
)
"""Keys (or prefixes ending in ``.``) whose change makes a resumed run another experiment."""
HARMLESS = (
    "data.epochs",
    "task.reward_timeout_s",
    "task.reward_workers",
    "task.reward_executor",
    "task.max_reward_error_frac",
    "task.reward_error_window",
    "episode.env_timeout_s",
    "episode.env_workers",
    "episode.max_env_failure_frac",
    "episode.env_failure_window",
    "episode.agent_timeout_s",
    "episode.agent_bind",
    "episode.agent_port",
    "episode.agent_model",
)
"""Exceptions inside ``MEANING``: more epochs keep every earlier prompt index; the reward's
execution settings do not change its values."""
_STEP = re.compile(r"step_([0-9]+)")


def flatten(node: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in node.items():
        key = f"{prefix}{k}"
        out |= flatten(v, key + ".") if isinstance(v, dict) else {key: v}
    return out


def changes(old: dict, new: dict) -> dict[str, list]:
    """``{key: [old, new]}`` for every leaf that differs (``run_dir`` and ``experiment_name``
    excepted: a moved directory is the same run)."""
    a, b = flatten(old), flatten(new)
    skip = {"run_dir", "experiment_name", "allow_config_change"}
    return {
        k: [a.get(k), b.get(k)]
        for k in sorted(a.keys() | b.keys())
        if k not in skip and a.get(k) != b.get(k)
    }


def meaningful(key: str) -> bool:
    if key in HARMLESS:
        return False
    return any(key == m or (m.endswith(".") and key.startswith(m)) for m in MEANING)


def refusal(changed: dict[str, list], run_dir: Path) -> str | None:
    """The message refusing a resume that changes ``MEANING`` keys, or None."""
    bad = {k: v for k, v in changed.items() if meaningful(k)}
    if not bad:
        return None
    shown = ", ".join(f"{k}: {v[0]!r} -> {v[1]!r}" for k, v in list(bad.items())[:6])
    more = f" and {len(bad) - 6} more" if len(bad) > 6 else ""
    return (
        f"run_dir={run_dir} resumes a run made with another configuration ({shown}{more}): "
        "training on would mix two experiments. Use a new run_dir, restore those values, or "
        "pass allow_config_change=true to continue anyway (each part's config is kept in "
        "config-parts/)"
    )


def resume_version(run_dir: Path) -> int:
    """The version a resume starts from: the newest complete checkpoint's (0 if none)."""
    done = [
        int(m.group(1))
        for p in (run_dir / "checkpoints").glob("step_*")
        if (m := _STEP.fullmatch(p.name)) and (p / "COMPLETE").is_file()
    ]
    return max(done, default=0)


def record_part(run_dir: Path, new: dict, changed: dict[str, list]) -> Path:
    """Write ``config-parts/part-<n>.json`` for the part starting now; returns its path."""
    parts = run_dir / "config-parts"
    parts.mkdir(exist_ok=True)
    n = len(list(parts.glob("part-*.json"))) + 1
    path = parts / f"part-{n}.json"
    doc = {"part": n, "from_version": resume_version(run_dir), "changed": changed, "config": new}
    path.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str))
    return path


def check_resume(cfg: Config, run_dir: Path) -> None:
    """Keep this part's config in ``config-parts/``; refuse a resume whose config changes
    what the run means, unless ``allow_config_change`` (the module docstring)."""
    new, old_path = json.loads(config_to_json(cfg)), run_dir / "config.json"
    try:
        if not old_path.is_file():
            record_part(run_dir, new, {})
            return
        old = migrate(json.loads(old_path.read_text()))
        changed = changes(old, new)
        if (why := refusal(changed, run_dir)) and not cfg.allow_config_change:
            raise RunDirError(why)
        if not (run_dir / "config-parts").is_dir():  # made before parts were kept
            record_part(run_dir, old, {})
        record_part(run_dir, new, changed)
    except (OSError, ValueError) as e:  # unreadable old config.json, an unwritable directory
        raise RunDirError(f"cannot keep the run's config parts: {e}") from None
