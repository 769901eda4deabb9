"""Which ``<run_dir>/checkpoints/step_<V>`` directories are complete, read without torch.

Complete = named ``step_<V>`` with a ``COMPLETE`` marker that says ``V``, written last, after
every other file of the save is durable (checkpoint.py writes it). The launcher reads this
before any process starts (orchestration/launch/checkpoint_checks.py), so importing torch
here would cost every ``asyncrl run`` a few CPU-seconds for two directory listings.
"""

from __future__ import annotations

import re
from pathlib import Path

MARKER = "COMPLETE"
_STEP = re.compile(r"step_([0-9]+)")


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """Newest complete checkpoint under ``run_dir/checkpoints`` (None if there is none).
    Temporary (``.tmp-*``) and trashed (``.old-*``) directories of interrupted saves are
    never candidates."""
    root = Path(run_dir) / "checkpoints"
    done = [(v, p) for p in root.glob("step_*") if (v := complete_version(p)) is not None]
    return max(done)[1] if done else None


def complete_version(path: Path) -> int | None:
    """``V`` if ``path`` is ``step_<V>`` with a marker saying ``V``, else None."""
    m = _STEP.fullmatch(path.name)
    if m is None:
        return None
    try:
        marker = (path / MARKER).read_text().strip()
    except OSError:
        return None
    return int(m.group(1)) if marker == str(int(m.group(1))) else None
