"""The prepared GPU check: everything asyncrl measures on a GPU, in one command of at most
8 minutes, on a bare GPU machine (torch with CUDA and transformers; no vLLM, Redis, ZeroMQ,
flash-attn or network). Run it through ``scripts/gpu_check.sh``, which installs the small
wheels the check needs (``.whl/``) first.

    bash scripts/gpu_check.sh              # on the GPU machine -> benchmarks/results/gpu/
    bash scripts/gpu_check.sh --dry-run    # the plumbing on a CPU, tiny shapes, no GPU needed

Parts, in order, each a subprocess with its own deadline (a part that fails or runs out of
time is recorded as such and the next one runs):

  env                 the device, driver, torch, CUDA, NCCL and transformers versions, commit;
  tests_gpu           ``pytest tests/gpu`` (every test there), JUnit XML;
  weight_path         ``benchmarks.learner.weight_path``: the sender's pack and device-to-host rates;
  learner_throughput  ``benchmarks.learner.throughput`` at the Qwen2.5-1.5B shape: the
                      ``asyncrl`` arm (packed sequences on a GPU), ``bucketed``
                      (``learner.pack_sequences=false``), ``compiled``
                      (``model.compile=true``; not in the dry run), ``lora16``
                      (``model.lora.rank=16``: LoRA adapters, the base frozen) and the bare
                      loop, side by side; one round, MFU on real tokens, peak memory, and
                      the largest batch of ``asyncrl``.

Everything lands in ``--out`` (default ``benchmarks/results/gpu``): ``summary.json`` (each
part's status, wall time and headline figures), the benchmarks' own JSON, ``tests_gpu.xml``
and ``gpu_check.log`` (every part's output). With ``--copy-to DIR`` (default: ``$OUT`` when
set, the device tool's folder) each file is also copied there as soon as it is written.
``--dry-run`` runs the same parts on the CPU at the ``tiny`` shape; ``--block-imports`` makes
every part's interpreter refuse the packages a bare GPU machine lacks, to prove the check
needs none of them (the dry-run test uses both).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "gpu"
ABSENT_ON_BARE_GPU = ("vllm", "redis", "zmq", "flash_attn", "math_verify", "gguf", "cryptography",
                      "wandb", "mlflow")  # fmt: skip
"""Top-level modules a bare GPU machine lacks (the device image; the carried wheels aside)."""

BLOCKER = '''import importlib.machinery, sys
class _Absent:
    """gpu_check --block-imports: as on a bare GPU machine, these packages are not there
    (the path finder does not see them, so ``importlib.util.find_spec`` returns None)."""
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in {names!r}:
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)
    @classmethod
    def invalidate_caches(cls):
        importlib.machinery.PathFinder.invalidate_caches()
    @classmethod
    def find_distributions(cls, *args, **kwargs):  # metadata stays visible: imports alone fail
        return importlib.machinery.PathFinder.find_distributions(*args, **kwargs)
sys.meta_path[:] = [_Absent if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
'''


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/gpu_check.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes: check the plumbing")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="results directory")
    p.add_argument("--copy-to", default=os.environ.get("OUT"), help="also copy results here")
    p.add_argument("--budget-s", type=float, default=480, help="the whole check's deadline")
    p.add_argument("--block-imports", action="store_true",
                   help="refuse the packages a bare GPU machine lacks")  # fmt: skip
    p.add_argument("--parts", default="env,tests_gpu,weight_path,learner_throughput")
    p.add_argument("--arm", action="append", default=[], metavar="NAME:key=value,...",
                   help="one more learner_throughput arm (its --arm), after the check's")  # fmt: skip
    p.add_argument("--profile", default="asyncrl", metavar="ARM,...",
                   help="learner_throughput arms to profile one extra step of ('' = none)")  # fmt: skip
    p.add_argument("--fit-max-groups", type=int, default=64,
                   help="the largest-batch search's bound (GPU; the dry run's is 2)")  # fmt: skip
    return p.parse_args(argv)


class Check:
    """The parts' shared state: where results go, the log, the deadline, the summary."""

    def __init__(self, args):
        self.args, self.out = args, Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.started = time.time() - 1  # files older than this run are not copied
        self.log = (self.out / "gpu_check.log").open("w")
        self.t0 = time.monotonic()
        self.summary: dict = {"dry_run": args.dry_run, "parts": {}}
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        if args.block_imports:
            site = Path(tempfile.mkdtemp(prefix="gpu-check-block-"))
            (site / "sitecustomize.py").write_text(BLOCKER.format(names=ABSENT_ON_BARE_GPU))
            self.env["PYTHONPATH"] = os.pathsep.join(
                [str(site), str(REPO), *filter(None, [self.env.get("PYTHONPATH")])]
            )

    def left(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.t0)

    def say(self, text: str) -> None:
        line = f"[gpu_check {time.monotonic() - self.t0:5.0f} s] {text}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def run(self, part: str, cmd: list[str], budget: float) -> dict:
        """Run ``cmd`` from the repo root with ``min(budget, time left)`` seconds, its output
        streamed to the console and the log; ``{status, rc, wall_s}``."""
        limit = max(1.0, min(budget, self.left() - 5))
        self.say(f"{part}: {' '.join(cmd)} (deadline {limit:.0f} s)")
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=REPO, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
        status = "timeout"
        try:
            deadline = t0 + limit
            for line in _lines_until(proc, deadline):
                sys.stdout.write(line)
                self.log.write(line)
            if proc.poll() is not None:
                status = "ok" if proc.returncode == 0 else "failed"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
        wall = time.monotonic() - t0
        self.say(f"{part}: {status} (rc {proc.returncode}, {wall:.0f} s)")
        return {"status": status, "rc": proc.returncode, "wall_s": round(wall, 1),
                "command": " ".join(cmd[1:] if cmd[0] == sys.executable else cmd)}  # fmt: skip

    def record(self, part: str, result: dict) -> None:
        self.summary["parts"][part] = result
        self.summary["wall_s"] = round(time.monotonic() - self.t0, 1)
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=2))
        self.copy()

    def copy(self) -> None:
        if not self.args.copy_to:
            return
        dest = Path(self.args.copy_to)
        dest.mkdir(parents=True, exist_ok=True)
        for f in self.out.iterdir():  # this run's files only: the device tool takes 8
            if f.is_file() and f.stat().st_mtime >= self.started:
                shutil.copy2(f, dest / f.name)


def _lines_until(proc: subprocess.Popen, deadline: float):
    """``proc``'s output lines until it exits or ``deadline`` passes (a reader thread, so a
    silent process cannot hold the deadline)."""
    import queue
    import threading

    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout] + [lines.put(None)],
                     daemon=True).start()  # fmt: skip
    while (wait := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=min(wait, 1.0))
        except queue.Empty:
            continue
        if line is None:
            proc.wait()
            return
        yield line


def env_facts() -> dict:
    """The device and the software: what every figure of the check depends on."""
    import platform

    import torch

    facts = {"python": platform.python_version(), "torch": torch.__version__,
             "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
             "cores": os.cpu_count(), "commit": _commit()}  # fmt: skip
    for mod in ("transformers", "hydra", "flash_attn", "triton"):
        try:
            facts[mod] = __import__(mod).__version__
        except Exception:  # not installed: say so
            facts[mod] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts |= {"gpu": props.name, "gpu_count": torch.cuda.device_count(),
                  "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                  "capability": f"{props.major}.{props.minor}",
                  "multiprocessors": props.multi_processor_count,
                  "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                  "cudnn": torch.backends.cudnn.version(), "driver": _driver()}  # fmt: skip
    return facts


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)  # fmt: skip
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return None


def _commit() -> str:
    sys.path.insert(0, str(REPO))
    from benchmarks.common import git_commit

    return git_commit()


def _not_this_run(path: Path, since: float) -> dict | None:
    """An ``error`` entry when ``path`` is missing or older than ``since`` (a file of an
    earlier run, which must not pass for this run's result), else None."""
    if not path.is_file():
        return {"error": f"{path.name} was not written"}
    if path.stat().st_mtime < since:
        return {"error": f"{path.name} was not written by this run (the file is an earlier run's)"}
    return None


def junit_counts(path: Path, since: float = 0.0) -> dict:
    """Passed, failed, skipped (with reasons) from pytest's JUnit XML."""
    if (missing := _not_this_run(path, since)) is not None:
        return missing
    out: dict = {"passed": [], "failed": {}, "skipped": {}}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            out["failed"][name] = (bad.get("message") or "")[:500]
        elif case.find("skipped") is not None:
            out["skipped"][name] = case.find("skipped").get("message", "")[:300]
        else:
            out["passed"].append(name)
    out["counts"] = {k: len(out[k]) for k in ("passed", "failed", "skipped")}
    return out


def headline_throughput(path: Path, since: float = 0.0) -> dict:
    """Per arm: real tokens/s, MFU, peak memory, the ratio to its reference, the largest fit."""
    if (missing := _not_this_run(path, since)) is not None:
        return missing
    doc = json.loads(path.read_text())
    arms = {}
    for name, a in doc.get("arms", {}).items():
        fit = a.get("fit") or {}
        arms[name] = {k: a.get(k) for k in ("status", "real_tokens_per_s", "mfu",
                                            "peak_memory_mib", "vs_ref", "layout",
                                            "profile")}  # fmt: skip
        arms[name]["largest_groups"] = fit.get("largest_groups")
        arms[name]["fit_at_bound"] = fit.get("at_bound")
    return {"arms": arms, "targets": doc.get("targets"), "partial": doc.get("partial"),
            "gpu": doc.get("gpu")}  # fmt: skip


def headline_weights(path: Path, since: float = 0.0) -> dict:
    if (missing := _not_this_run(path, since)) is not None:
        return missing
    doc = json.loads(path.read_text())
    return {"wire_bytes": doc["wire_bytes"],
            "gb_per_s": {k: round(v["gb_per_s"], 2) for k, v in doc["paths"].items()},
            "seconds": {k: round(v["median_s"], 3) for k, v in doc["paths"].items()}}  # fmt: skip


def main(argv=None) -> int:
    args = parse_args(argv)
    check = Check(args)
    py, out, dry = sys.executable, _relative(check.out), args.dry_run
    preset = "tiny" if dry else "qwen2.5-1.5b"
    device = ["--device", "cpu"] if dry else ["--device", "cuda"]
    parts = [p for p in args.parts.split(",") if p]
    for part in parts:
        if check.left() < 10:
            check.record(part, {"status": "skipped", "reason": "the check's deadline passed"})
            continue
        if part == "env":
            res = check.run(part, [py, "-c", "import sys; sys.path.insert(0, 'scripts'); "
                                   "import gpu_check, json; print(json.dumps(gpu_check.env_facts()))"],
                            60)  # fmt: skip
            check.summary["env"] = _last_json_line(check.out / "gpu_check.log")
        elif part == "tests_gpu":
            res = check.run(part, [py, "-m", "pytest", "tests/gpu", "-v", "-p", "no:cacheprovider",
                                   f"--junitxml={out}/tests_gpu.xml", "-o", "timeout=150"],
                            200)  # fmt: skip
            res |= junit_counts(check.out / "tests_gpu.xml", check.started)
        elif part == "weight_path":
            res = check.run(part, [py, "-m", "benchmarks.learner.weight_path", "--preset", preset, *device,
                                   "--out", out, "--name", "weight_path"], 90)  # fmt: skip
            res |= headline_weights(check.out / "weight_path.json", check.started)
        elif part == "learner_throughput":
            fit = ["--fit-arms", "asyncrl", "--fit-max-groups",
                   "2" if dry else str(args.fit_max_groups)]  # fmt: skip
            extra = [a for arm in args.arm for a in ("--arm", arm)]
            # the dry run leaves the compiled arm out: it would only time inductor's CPU build
            # (~25 s of CI); the arm's plumbing is every other arm's
            compiled = [] if dry else ["--arm", "compiled:model.compile=true"]
            lora = ["--arm", "lora16:model.lora.rank=16"]  # adapters on every linear layer
            res = check.run(part, [py, "-m", "benchmarks.learner.throughput", "--preset", preset,
                                   *device, "--arms", "asyncrl", *compiled, "--arm", "bare",
                                   "--arm", "bucketed:learner.pack_sequences=false", *lora, *extra,
                                   "--profile", args.profile, "--rounds", "1", "--repeat", "2", *fit, "--timeout", "200",
                                   "--out", out, "--name", "learner_throughput"],
                            check.left())  # fmt: skip
            res |= headline_throughput(check.out / "learner_throughput.json", check.started)
        else:
            raise SystemExit(
                f"unknown part {part!r}: env, tests_gpu, weight_path, learner_throughput"
            )
        check.record(part, res)
    failed = [p for p, r in check.summary["parts"].items() if r["status"] != "ok"]
    check.say(f"done in {time.monotonic() - check.t0:.0f} s: "
              + (f"not ok: {', '.join(failed)}" if failed else "every part ok")
              + f"; results in {out}")  # fmt: skip
    check.copy()
    return 1 if failed else 0


def _relative(path: Path) -> str:
    """``path`` from the repo root where it is inside it (commands without machine paths)."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def _last_json_line(log: Path) -> dict | None:
    for line in reversed(log.read_text().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return None


if __name__ == "__main__":
    raise SystemExit(main())
