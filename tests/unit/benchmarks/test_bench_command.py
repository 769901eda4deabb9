"""A benchmark's recorded command has no machine-specific paths (benchmarks/common.py)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.common import REPO, portable_arg


def test_paths_inside_the_checkout_become_relative_and_others_a_placeholder():
    assert portable_arg(str(REPO / "runs" / "benchmarks")) == "runs/benchmarks"
    assert portable_arg(f"--out={REPO / 'benchmarks' / 'results'}") == "--out=benchmarks/results"
    assert portable_arg("/elsewhere/runs") == "PATH"
    assert portable_arg("--runs-dir=/elsewhere") == "--runs-dir=PATH"
    for kept in ("--steps", "9", "smollm2", "--set", "learner.lr=1e-5", "a/b"):
        assert portable_arg(kept) == kept


def test_the_checkout_is_found_as_given(tmp_path):
    repo = tmp_path / "checkout"
    (repo / "x").mkdir(parents=True)
    assert portable_arg(str(repo / "x"), repo) == "x"
    assert portable_arg(str(Path("/tmp")), repo) == "PATH"
