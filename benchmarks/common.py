"""Shared pieces of the benchmarks: machine description, commit, JSON output, timing.

Every benchmark writes ``benchmarks/results/<name>.json`` with ``machine``, ``commit``,
``command`` and ``config`` next to its figures, so a number can always be traced to what
produced it. The per-step traces of whole runs (``runs[i].records``, ``.steps``,
``.curves``: most of a result's bytes) go beside it, compressed, in
``<name>.records.json.gz``; ``read_result`` puts them back.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"


def machine() -> dict:
    """CPU model, cores (and which this process may use), memory, library versions."""
    info = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": sorted(os.sched_getaffinity(0)),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_avg_1_5_15_min": os.getloadavg(),  # at write time; others share these cores
    }
    for mod in ("torch", "vllm", "pyarrow", "redis"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # not installed, or fails to import: record that, do not fail
            info[mod] = None
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit() -> str:
    """HEAD, with ``-dirty`` when tracked files differ from it. ``$ASYNCRL_COMMIT`` wins when
    set: a working tree copied to a GPU machine can carry a stale ``.git`` (the first GPU
    check's read eeff92c-dirty for a tree at f1f8497)."""
    if os.environ.get("ASYNCRL_COMMIT"):
        return os.environ["ASYNCRL_COMMIT"]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "diff", "--quiet", "HEAD", "--"], cwd=REPO, capture_output=True
        ).returncode
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


_START_COMMIT = git_commit()
"""The code a benchmark ran: HEAD when it started (commits made while it ran, by anyone, come
after; ``commit_at_write`` records the HEAD at write time when it differs)."""


def dirty_files() -> list[str]:
    """Tracked files that differ from HEAD (``git diff --name-only HEAD``), result files under
    benchmarks/results/ left out; [] when clean or not a git checkout."""
    try:
        out = subprocess.run(["git", "diff", "--name-only", "HEAD", "--"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return []
    # earlier benchmarks' result files are outputs, not the code that ran
    return [
        line for line in out.splitlines() if line and not line.startswith("benchmarks/results/")
    ]


_START_DIRTY = [] if os.environ.get("ASYNCRL_COMMIT") else dirty_files()
"""What differed from HEAD when the benchmark started (recorded as ``dirty_files``)."""

ALLOW_DIRTY_ENV = "ASYNCRL_ALLOW_DIRTY"
"""Set to 1 to let a benchmark started from a modified tree write into benchmarks/results/."""


class DirtyTree(RuntimeError):
    """A result for benchmarks/results/ from code that is not a commit."""


def _refuse_dirty(doc: dict, name: str, out_dir: Path) -> None:
    """``DirtyTree`` when ``out_dir`` is the committed results folder, the run started from a
    modified tree and ``ASYNCRL_ALLOW_DIRTY`` is not 1; the result is kept in a temporary file
    first (named in the message), so the run is not lost. Three committed results once said
    ``-dirty`` (issue 43 round 4)."""
    if not _START_DIRTY or os.environ.get(ALLOW_DIRTY_ENV) == "1":
        return
    try:
        Path(out_dir).resolve().relative_to(RESULTS.resolve())
    except ValueError:
        return  # a result written elsewhere (a test's temporary folder) only records it
    import tempfile

    fd, kept = tempfile.mkstemp(prefix=f"{name}-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, default=_jsonable)
    raise DirtyTree(
        f"refusing to write {name} into {out_dir}: the benchmark started from a tree whose "
        f"tracked files differ from HEAD ({', '.join(_START_DIRTY[:8])}); the result is kept in "
        f"{kept}. Commit the change and rerun, or set {ALLOW_DIRTY_ENV}=1 to write it with "
        "the list of what differed (dirty_files)"
    )


def portable_arg(arg: str, repo: Path = REPO) -> str:
    """``arg`` without this machine's paths: an absolute path (or ``--opt=PATH``) inside the
    checkout becomes relative to it, one outside becomes ``PATH`` (where files went, not what
    was measured)."""
    opt, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
    if not value.startswith("/"):
        return arg
    try:
        value = str(Path(value).resolve().relative_to(repo.resolve()))
    except ValueError:
        value = "PATH"
    return f"{opt}{eq}{value}"


def rerun_command() -> str:
    """The command that reruns this benchmark from the repository root: ``python -m
    benchmarks.<module> <args>`` (``sys.argv[0]`` is a file path, which cannot import
    ``benchmarks.*`` when run as a script), without this machine's paths (``portable_arg``)."""
    import shlex

    main = sys.modules.get("__main__")
    module = getattr(getattr(main, "__spec__", None), "name", None)
    if module:  # a family run as a package (benchmarks/vs_trl/__main__.py): its package's name
        module = module.removesuffix(".__main__")
    if not module:
        script = Path(sys.argv[0]).resolve()
        try:
            module = ".".join(script.relative_to(REPO).with_suffix("").parts)
        except ValueError:
            module = script.stem
    args = [shlex.quote(portable_arg(a)) for a in sys.argv[1:]]
    return " ".join(["python", "-m", module, *args])


def asyncrl_run(overrides: list[str], run_dir: Path) -> list[str]:
    """The command line of ``asyncrl run OVERRIDES run_dir=RUN_DIR`` in this interpreter."""
    return [sys.executable, "-m", "asyncrl.orchestration.cli", "run", *overrides,
            f"run_dir={run_dir}"]  # fmt: skip


def write_result(name: str, payload: dict, out_dir: Path = RESULTS) -> Path:
    """``<out_dir>/<name>.json`` with ``machine``, ``commit`` and ``command`` added (the runs'
    per-step traces in ``<name>.records.json.gz``: ``split_records``)."""
    doc = {
        "name": name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": rerun_command(),
        "commit": _START_COMMIT,
        **({"commit_at_write": now} if (now := git_commit()) != _START_COMMIT else {}),
        **({"dirty_files": _START_DIRTY} if _START_DIRTY else {}),
        "machine": machine(),
        **payload,
    }
    _refuse_dirty(doc, name, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    write_split(path, json.loads(json.dumps(doc, default=_jsonable)))
    return path


def write_with_table(name: str, payload: dict, table: str, out_dir: Path, tag: str) -> Path:
    """``write_result`` with ``table`` (Markdown) in the JSON as ``table_markdown`` and beside
    it as ``<name>.md``; prints the table and where it went, ``[tag]``-prefixed."""
    path = write_result(name, {**payload, "table_markdown": table}, out_dir)
    (out_dir / f"{name}.md").write_text(table + "\n")
    print("\n" + table + f"\n\n[{tag}] wrote {path}", flush=True)
    return path


RECORDS_SUFFIX = ".records.json.gz"
RECORDS_FILE = "<name>" + RECORDS_SUFFIX  # where a split result's traces are
TRACE_KEYS = ("records", "steps", "curves")
"""The keys of a run that hold one entry per step (the sync_vs_async, vs_trl and
staleness_correction families): the raw traces the figures are computed from."""


def split_records(doc: dict) -> tuple[dict, dict | None]:
    """``doc`` without its runs' per-step traces, and those traces by run index (``"3"``:
    ``{"records": runs[3]["records"]}``); ``(doc, None)`` when no run has any. Lossless:
    ``join_records`` of the two equals ``doc``."""
    runs = doc.get("runs")
    if not isinstance(runs, list):
        return doc, None
    traces = {str(i): _traces_of(r) for i, r in enumerate(runs) if _traces_of(r)}
    if not traces:
        return doc, None
    slim = [
        {k: v for k, v in r.items() if k not in _traces_of(r)} if isinstance(r, dict) else r
        for r in runs
    ]
    return {**doc, "runs": slim, "records_file": RECORDS_FILE}, traces


def _traces_of(run) -> dict:
    """The per-step lists of one run (a count such as ``"steps": 300`` stays)."""
    if not isinstance(run, dict):
        return {}
    return {k: run[k] for k in TRACE_KEYS if isinstance(run.get(k), list)}


def join_records(doc: dict, traces: dict | None) -> dict:
    """The inverse of ``split_records``."""
    if traces is None:
        return doc
    runs = [{**r, **traces.get(str(i), {})} for i, r in enumerate(doc["runs"])]
    return {**{k: v for k, v in doc.items() if k != "records_file"}, "runs": runs}


def write_split(path: Path, doc: dict) -> None:
    """Write ``doc`` as ``path`` and, if its runs have traces, ``<stem>.records.json.gz``."""
    slim, records = split_records(doc)
    sidecar = path.with_name(path.stem + RECORDS_SUFFIX)
    if records is not None:
        data = json.dumps(records, separators=(",", ":")).encode()
        # mtime=0: the same records give the same bytes (no diff from a rewrite alone)
        sidecar.write_bytes(gzip.compress(data, mtime=0))
    path.write_text(json.dumps(slim, indent=2))


def read_result(path: Path) -> dict:
    """A result as its benchmark wrote it, traces included."""
    doc = json.loads(path.read_text())
    sidecar = path.with_name(path.stem + RECORDS_SUFFIX)
    if "records_file" not in doc:
        return doc
    return join_records(doc, json.loads(gzip.decompress(sidecar.read_bytes())))


def _jsonable(x):
    if isinstance(x, float) and x != x:
        return None
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


def timed(fn: Callable[[], object], repeat: int, warmup: int = 1) -> dict:
    """Run ``fn`` ``warmup`` times untimed, then ``repeat`` times; seconds per call."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "mean_s": statistics.fmean(times),
        "repeat": repeat,
    }


def mean_std(values: list[float]) -> dict:
    vals = [v for v in values if v is not None and v == v]
    if not vals:
        return {"mean": None, "std": None, "n": 0}
    return {
        "mean": statistics.fmean(vals),
        "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
        "n": len(vals),
    }


def md_table(header: list[str], rows: list[list]) -> str:
    def cell(x):
        if isinstance(x, float):
            return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"
        return "-" if x is None else str(x)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
