"""Split the committed results written before ``write_result`` kept the runs' per-step
traces apart: each ``results/**/<name>.json`` whose runs carry them becomes the
summary ``<name>.json`` plus ``<name>.records.json.gz`` (``benchmarks.common.write_split``,
the same split every benchmark now writes). Checks that ``read_result`` gives back exactly
the file it read before writing anything.

    python -m benchmarks.compact_results            # every result under benchmarks/results
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common import RECORDS_SUFFIX, RESULTS, read_result, split_records, write_split


def compact(path: Path) -> tuple[int, int] | None:
    """Split one result file in place; ``(bytes before, bytes after)``, None if it has no
    traces to split (or is split already)."""
    doc = json.loads(path.read_text())
    if split_records(doc)[1] is None:
        return None
    before = path.stat().st_size
    write_split(path, doc)
    if read_result(path) != doc:
        raise SystemExit(f"{path}: the split does not read back as the original; restore it")
    after = path.stat().st_size + path.with_name(path.stem + RECORDS_SUFFIX).stat().st_size
    return before, after


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    total = [0, 0]
    for path in sorted(args.dir.rglob("*.json")):
        sizes = compact(path)
        if sizes:
            total[0] += sizes[0]
            total[1] += sizes[1]
            print(
                f"{path.relative_to(args.dir)}: {sizes[0] / 1e6:.2f} MB -> {sizes[1] / 1e6:.2f} MB"
            )
    print(f"all: {total[0] / 1e6:.2f} MB -> {total[1] / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
