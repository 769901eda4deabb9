"""The order in which two pytest workers take the test files: longest first.

``make test`` runs ``pytest -n 2 --dist loadfile``: a worker takes a whole file, then the next
one in the queue. xdist orders that queue by the number of tests in a file, most first, which
puts the files of one or two long end-to-end tests (a Slurm job, a multi-host run: minutes
each) last; one worker then ran such a file alone while the other sat idle (the last ~4
minutes of a 44-minute CI were ~70% idle). Longest-processing-time first (the classic
scheduling rule, within 4/3 of the best split) leaves the short unit-test files for the end,
where they fill the gaps.

A file's cost is its seconds in ``tests/durations.json``, written from a CI run's JUnit report
by ``python -m tests.schedule JUNIT_XML`` (setup, call and teardown of every test summed per
file). A file it does not list (new since) costs ``NEW_FILE_S`` by its folder. Within a file
the order is untouched (module fixtures are shared in order).
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

DURATIONS = Path(__file__).with_name("durations.json")
REPO = Path(__file__).resolve().parents[1]
NEW_FILE_S = {"slurm": 120.0, "multihost": 90.0, "e2e": 60.0, "faults": 60.0,
              "integration": 20.0, "security": 20.0}  # fmt: skip
"""The assumed seconds of a file missing from durations.json, by its folder under tests/
(others: ``UNIT_S``): new end-to-end files go early, where a wrong guess costs least."""
UNIT_S = 2.0


def load_costs(path: Path = DURATIONS) -> dict[str, float]:
    """``{file: seconds}`` from ``path`` (empty when it is missing)."""
    if not path.is_file():
        return {}
    return {k: float(v) for k, v in json.loads(path.read_text())["seconds"].items()}


def cost(file: str, costs: dict[str, float]) -> float:
    """Seconds ``file`` (``tests/...py``) is expected to take."""
    if file in costs:
        return costs[file]
    parts = file.split("/")
    return NEW_FILE_S.get(parts[1], UNIT_S) if len(parts) > 2 else UNIT_S


def longest_first(nodeids: list[str], costs: dict[str, float]) -> list[int]:
    """Indices of ``nodeids`` ordered by their file's cost, longest first; stable, so the
    tests of one file keep their order and stay together."""
    file = [n.split("::", 1)[0] for n in nodeids]
    return sorted(range(len(nodeids)), key=lambda i: -cost(file[i], costs))


def file_of(classname: str) -> str:
    """``tests/e2e/test_x.py`` of a JUnit ``classname`` (``tests.e2e.test_x`` or
    ``tests.e2e.test_x.TestCase``)."""
    parts = classname.split(".")
    for n in range(len(parts), 0, -1):
        path = "/".join(parts[:n]) + ".py"
        if (REPO / path).is_file():
            return path
    return "/".join(parts) + ".py"


def durations(junit: Path) -> dict[str, float]:
    """``{file: seconds}`` summed over a JUnit report's test cases (their time includes
    setup and teardown), rounded to 0.1 s."""
    total: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).getroot().iter("testcase"):
        total[file_of(case.get("classname", ""))] += float(case.get("time", 0.0))
    return {f: round(s, 1) for f, s in sorted(total.items())}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.schedule JUNIT_XML  (writes tests/durations.json)")
        return 2
    seconds = durations(Path(argv[0]))
    doc = {"written_by": "python -m tests.schedule JUNIT_XML (a `make test` run's "
           "--junitxml report)", "total_s": round(sum(seconds.values())), "seconds": seconds}  # fmt: skip
    DURATIONS.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{DURATIONS}: {len(seconds)} files, {doc['total_s']} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
