"""mypy on a few files, for the tests of the seams (tests/unit/conformance.py): each test names
the seam's own files and the files that use it, so the check takes seconds, not the minute that
following torch's types takes (``make lint`` runs the whole check of pyproject.toml)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFORMANCE = "tests/unit/conformance.py"


def mypy(files: list[str | Path], cache_dir: Path) -> tuple[int, str]:
    """``(exit status, report)`` of mypy on ``files`` (relative to the repository) alone: the
    modules they import are not read (``follow_imports=skip``: their names are ``Any``), so
    what is checked is each file's use of the others' names and signatures."""
    api = pytest.importorskip("mypy.api", reason="mypy is in the dev extra: pip install -e .[dev]")
    args = [
        "--config-file=",  # pyproject's files and follow_imports are the whole check's
        "--python-version=3.10",
        "--follow-imports=skip",
        "--ignore-missing-imports",
        f"--cache-dir={cache_dir}",
        "--no-error-summary",
        *(str(ROOT / f) for f in files),
    ]
    out, err, status = api.run(args)
    return status, out + err


def rejected(files: list[str | Path], cache_dir: Path) -> tuple[list[str], str]:
    """The error lines of mypy on ``files``, which must fail, and its whole report."""
    status, report = mypy(files, cache_dir)
    assert status == 1, report
    return [line for line in report.splitlines() if ": error: " in line], report
