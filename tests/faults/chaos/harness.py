"""Running a chaos schedule against a live job, and keeping what the checker needs.

``Observer`` (a thread) keeps, while the job runs:

- ``<chaos>/aof/``: a hard link to every file redis-server writes in ``appendonlydir/``, made
  as the file appears; Redis deletes an AOF's older files after a rewrite, the links keep
  them (an incr file is append-only, so the link sees every later write too);
- ``<chaos>/lines.jsonl``: each line of the console and of ``learner.log``, with the time
  it appeared (the logs carry no times of their own).

``Injector`` runs the schedule (schedule.py) on a ``Targets`` (how to find each process, and
the host partitions and the disk, if any), one thread, and writes ``<chaos>/faults.jsonl``:
each fault with the times it started and ended, and a note when it could not be injected
(its process was not running: a restart under way). On any exit it resumes what it stopped,
heals what it cut and empties the disk.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from tests.faults.chaos.checker import ENDING
from tests.faults.chaos.schedule import DISK_FULL, KILL, PARTITION, STOP, Fault

STEP_LINE = re.compile(r"^step +(\d+) \|", re.M)


class Observer(threading.Thread):
    """Links the AOF's files and timestamps the logs' lines (module docstring) every ``poll_s``
    until ``stop``."""

    def __init__(self, chaos_dir: Path, aof_dir: Path, logs: dict[str, Path], poll_s: float = 0.1):
        super().__init__(name="chaos-observer", daemon=True)
        self.chaos_dir, self.aof_dir, self.logs, self.poll_s = chaos_dir, aof_dir, logs, poll_s
        (chaos_dir / "aof").mkdir(parents=True, exist_ok=True)
        self._offsets = dict.fromkeys(logs, 0)
        self._partial = dict.fromkeys(logs, b"")
        self._linked: dict[str, int] = {}
        self._halt = threading.Event()
        self._out = open(chaos_dir / "lines.jsonl", "a")
        self.problems: list[str] = []
        self.steps = 0
        """Step lines seen on the console so far."""
        self.failed = False
        """A launcher showed the job failing (``checker.ENDING``): stop injecting."""

    def run(self) -> None:
        while not self._halt.is_set():
            self.poll()
            self._halt.wait(self.poll_s)
        self.poll()
        self._out.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(30)

    def poll(self) -> None:
        try:
            self._link()
        except OSError as e:
            self.problems.append(f"linking the AOF: {e}")
        now = time.time()
        for source, path in self.logs.items():
            for line in self._read(source, path):
                self._out.write(json.dumps({"t": now, "source": source, "text": line}) + "\n")
                if source == "console" and STEP_LINE.match(line):
                    self.steps += 1
                if source.startswith("console") and ENDING.search(line):
                    self.failed = True
        self._out.flush()

    def _link(self) -> None:
        if not self.aof_dir.is_dir():
            return
        for f in self.aof_dir.iterdir():
            if f.name in self._linked or not f.name.endswith(".aof"):
                continue
            with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                os.link(f, self.chaos_dir / "aof" / f.name)
                self._linked[f.name] = f.stat().st_ino

    def _read(self, source: str, path: Path) -> list[str]:
        try:
            with open(path, "rb") as f:
                f.seek(self._offsets[source])
                data = f.read()
        except FileNotFoundError:
            return []
        self._offsets[source] += len(data)
        data = self._partial[source] + data
        *lines, self._partial[source] = data.split(b"\n")
        return [ln.decode(errors="replace").rstrip("\r") for ln in lines]


@dataclass
class Targets:
    """How to reach what a schedule names. ``find(name)`` -> the pid of process ``name``
    (None while it is not running); ``partition`` / ``heal`` a host; ``disk``: the mount point
    of the checkpoint file system (None: no disk faults here)."""

    find: Callable[[str], int | None]
    partition: Callable[[str], None] | None = None
    heal: Callable[[str], None] | None = None
    disk: Path | None = None


@dataclass
class Done:
    """One fault as injected (the checker's ``Fault``)."""

    t: float
    kind: str
    target: str
    end: float | None = None
    note: str = ""


class Injector(threading.Thread):
    """Runs ``schedule`` from ``t0`` (wall clock) on ``targets`` until it is over or ``over()``
    (the job ended); see the module docstring."""

    def __init__(self, schedule: list[Fault], targets: Targets, chaos_dir: Path, t0: float,
                 over: Callable[[], bool]) -> None:  # fmt: skip
        super().__init__(name="chaos-injector", daemon=True)
        self.schedule, self.targets, self.t0, self.over = schedule, targets, t0, over
        self.log = open(chaos_dir / "faults.jsonl", "a")
        self.done: list[Done] = []
        self.errors: list[str] = []
        self._held: dict[int, tuple[Fault, Done, int, float]] = {}  # open faults: what to undo
        self._abort = threading.Event()

    def run(self) -> None:
        queue: list = [(self.t0 + f.t_s, n, "start", f) for n, f in enumerate(self.schedule)]
        heapq.heapify(queue)
        try:
            while queue and not self._abort.is_set():
                at, n, what, fault = queue[0]
                if self.over():
                    break
                if time.time() < at:
                    self._abort.wait(min(0.05, at - time.time()))
                    continue
                heapq.heappop(queue)
                if what == "start":
                    if self._start(n, fault) and fault.duration_s:
                        heapq.heappush(queue, (at + fault.duration_s, n, "end", fault))
                else:
                    self._end(n)
        except Exception as e:  # reported by the test, after the undo below
            self.errors.append(f"{type(e).__name__}: {e}")
        finally:
            for n in list(self._held):
                self._end(n)
            self.log.close()

    def abort(self) -> None:
        self._abort.set()
        self.join(60)

    def _record(self, done: Done) -> None:
        self.done.append(done)
        self.log.write(json.dumps(asdict(done)) + "\n")
        self.log.flush()

    def _start(self, n: int, f: Fault) -> bool:
        """Inject ``f``; True if it has an end to come."""
        done = Done(time.time(), f.kind, f.target)
        if f.kind in (KILL, STOP):
            pid = self.targets.find(f.target)
            proc = _process(pid)
            if proc is None:
                done.note = "not running (a restart under way)"
                self._record(done)
                return False
            done.t = time.time()
            os.kill(proc.pid, signal.SIGKILL if f.kind == KILL else signal.SIGSTOP)
            if f.kind == KILL:
                self._record(done)
                return False
            self._held[n] = (f, done, proc.pid, proc.create_time())
            return True
        if f.kind == PARTITION and self.targets.partition is not None:
            self.targets.partition(f.target)
        elif f.kind == DISK_FULL and self.targets.disk is not None:
            fill(self.targets.disk)
        else:
            done.note = f"no {f.kind} here"
            self._record(done)
            return False
        self._held[n] = (f, done, 0, 0.0)
        return True

    def _end(self, n: int) -> None:
        f, done, pid, created = self._held.pop(n)
        if f.kind == STOP:
            proc = _process(pid)
            if proc is not None and proc.create_time() == created:
                os.kill(pid, signal.SIGCONT)
        elif f.kind == PARTITION and self.targets.heal is not None:
            self.targets.heal(f.target)
        elif f.kind == DISK_FULL and self.targets.disk is not None:
            empty(self.targets.disk)
        done.end = time.time()
        self._record(done)


def _process(pid: int | None) -> psutil.Process | None:
    if pid is None:
        return None
    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc
    except psutil.NoSuchProcess:
        return None


# -- finding a job's processes --------------------------------------------------------------------


def find_role(run_dir: Path, name: str) -> int | None:
    """The pid of ``name`` (``actor<i>``, ``learner``: its rank, not torchrun; ``redis``) of
    the job in ``run_dir``, or None."""
    if name == "redis":
        return redis_pid(run_dir)
    if name == "learner":
        want, extra = "asyncrl.learner.main", None
    else:
        want, extra = "asyncrl.actors.main", name.removeprefix("actor")
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if want not in cmd or str(run_dir) not in cmd or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if "asyncrl.core.runtime.torchrun" in cmd:
            continue
        if extra is not None and not (
            "--actor-id" in cmd and cmd[cmd.index("--actor-id") + 1] == extra
        ):
            continue
        return p.pid
    return None


def redis_pid(run_dir: Path) -> int | None:
    """The redis-server serving ``run_dir``'s buffer (found by its port), or None."""
    try:
        url = (run_dir / "redis" / "redis.url").read_text().strip()
    except OSError:
        return None
    port = url.rsplit(":", 1)[1].split("/")[0]
    for p in psutil.process_iter(["name", "cmdline", "status"]):
        alive = p.info["status"] != psutil.STATUS_ZOMBIE
        if (
            p.info["name"] == "redis-server"
            and alive
            and f":{port}" in " ".join(p.info["cmdline"] or [])
        ):
            return p.pid
    return None


# -- the checkpoint disk --------------------------------------------------------------------------

FILLER = ".chaos-fill"


def mount_small_disk(path: Path, size_mb: int) -> str | None:
    """Mount a tmpfs of ``size_mb`` at ``path``; None, or why not (needs root)."""
    path.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        return "no mount command"
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "tmpfs",
                        str(path)], capture_output=True, text=True, timeout=30)  # fmt: skip
    return None if r.returncode == 0 else (r.stderr.strip() or f"mount exited {r.returncode}")


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def fill(mount: Path) -> int:
    """Fill the file system at ``mount`` (a file of zeros until ENOSPC); its size."""
    written = 0
    chunk = b"\0" * (1 << 20)
    with open(mount / FILLER, "ab", buffering=0) as f:
        for size in (1 << 20, 1 << 12):
            piece = chunk[:size]
            while True:
                try:
                    f.write(piece)
                    written += size
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
    return written


def empty(mount: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (mount / FILLER).unlink()
