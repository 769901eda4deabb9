"""A result's per-step traces live beside it, compressed (benchmarks/common.py): the split is
lossless, a count named like a trace stays, and every committed result reads back whole."""

import gzip
import json

from benchmarks.common import (
    RECORDS_SUFFIX,
    RESULTS,
    join_records,
    read_result,
    split_records,
    write_split,
)

DOC = {
    "name": "x",
    "runs": [
        {"arm": "a", "records": [{"step": 1, "reward": 0.5}], "summary": {"steps": 1}},
        {"arm": "b", "returncode": 1},  # a failed run: nothing to split
        {"arm": "c", "steps": 300, "curves": [[0, 1.0]]},  # a count stays, a list moves
    ],
}


def test_the_split_is_lossless_and_keeps_counts(tmp_path):
    slim, traces = split_records(DOC)
    assert traces == {"0": {"records": [{"step": 1, "reward": 0.5}]}, "2": {"curves": [[0, 1.0]]}}
    assert slim["runs"][2] == {"arm": "c", "steps": 300} and "records" not in slim["runs"][0]
    assert join_records(slim, traces) == DOC
    path = tmp_path / "x.json"
    write_split(path, DOC)
    sidecar = tmp_path / f"x{RECORDS_SUFFIX}"
    assert json.loads(gzip.decompress(sidecar.read_bytes())) == traces
    assert read_result(path) == DOC
    assert split_records({"name": "y", "runs": [{"arm": "a"}]}) == (
        {"name": "y", "runs": [{"arm": "a"}]},
        None,
    )


def test_every_committed_result_reads_back_with_its_traces():
    split = 0
    for path in RESULTS.rglob("*.json"):
        doc = json.loads(path.read_text())
        if "records_file" in doc:
            split += 1
            assert path.with_name(path.stem + RECORDS_SUFFIX).exists(), path
            assert split_records(read_result(path))[0] == doc, path
        else:
            assert split_records(doc)[1] is None, (
                f"{path}: run python -m benchmarks.compact_results"
            )
    assert split >= 10, "the big results are split"
