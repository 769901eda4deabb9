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


def test_a_result_from_a_modified_tree_is_refused_for_the_results_folder_and_kept(
    tmp_path, monkeypatch
):
    """Issue 43 round 4: three committed results recorded a '-dirty' commit. A benchmark
    started from a tree with modified tracked files may not write into benchmarks/results/
    unless ASYNCRL_ALLOW_DIRTY=1, and then records what differed; elsewhere it records it."""
    import json

    import pytest

    from benchmarks import common

    monkeypatch.setattr(common, "_START_DIRTY", ["asyncrl/x.py"])
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    monkeypatch.delenv(common.ALLOW_DIRTY_ENV, raising=False)
    with pytest.raises(common.DirtyTree) as e:
        common.write_result("probe", {"value": 1}, tmp_path / "results")
    text = str(e.value)
    assert "refusing to write probe into" in text and "(asyncrl/x.py)" in text
    kept = text.split("the result is kept in ")[1].split(". Commit")[0]
    assert json.loads(open(kept).read())["value"] == 1 and not (tmp_path / "results").exists()
    written = common.write_result("probe", {"value": 2}, tmp_path / "elsewhere")
    assert json.loads(written.read_text())["dirty_files"] == ["asyncrl/x.py"]
    monkeypatch.setenv(common.ALLOW_DIRTY_ENV, "1")
    allowed = common.write_result("probe", {"value": 3}, tmp_path / "results")
    assert json.loads(allowed.read_text())["dirty_files"] == ["asyncrl/x.py"]
