"""A pids cgroup for one sandbox: a process limit that the kernel enforces for every user.

RLIMIT_NPROC does not bind uid 0, so for a sandbox started by root it limits nothing, and a
polling watchdog lets a fork bomb overshoot between two polls (83 processes against a limit of
16 in one CI run). The pids controller binds root too: ``fork`` fails with EAGAIN at
``pids.max`` tasks (threads count), and ``pids.events`` counts the refusals.

``PidsCgroup.create(limit)`` makes ``asyncrl-sandbox-<pid>-<hex>`` under this process's own
cgroup in the first hierarchy that has the pids controller: cgroup v1's ``pids`` or cgroup v2
where the parent delegates ``pids`` (``cgroup.subtree_control``). It returns None where none can
be made (no root and no delegation, a read-only cgroupfs as in most containers, no pids
controller): the sandbox then runs with RLIMIT_NPROC and the watchdog only, and does not list
the ``cgroup`` layer. A process SIGKILLed between ``create`` and ``remove`` leaves an empty
directory behind (harmless; ``rmdir`` removes it). Standard library only (the sandbox's child
imports it).
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PidsCgroup"]


@dataclass(frozen=True)
class PidsCgroup:
    """One sandbox's cgroup directory (``path``); ``remove`` it when the sandbox is dead."""

    path: Path

    @classmethod
    def create(cls, limit: int) -> PidsCgroup | None:
        """A new cgroup allowing at most ``limit`` tasks, or None where none can be made."""
        name = f"asyncrl-sandbox-{os.getpid()}-{secrets.token_hex(4)}"
        for base in _own_pids_cgroups():
            path = base / name
            try:
                path.mkdir()
            except OSError:
                continue
            try:
                (path / "pids.max").write_text(str(limit))
                return cls(path)
            except OSError:
                _rmdir(path)
        return None

    def join(self, pid: int) -> None:
        """Move ``pid`` (and its future children) into the cgroup. Raises OSError."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def refused_forks(self) -> int:
        """How many forks or thread starts the limit refused so far (``pids.events``)."""
        try:
            for line in (self.path / "pids.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "max":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def remove(self, deadline_s: float = 5.0) -> bool:
        """SIGKILL whatever is left in the cgroup, then remove it (retried until the kernel
        has reaped every task, at most ``deadline_s``). False if it is still there."""
        deadline = time.monotonic() + deadline_s
        while True:
            for pid in self._pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if _rmdir(self.path) or time.monotonic() >= deadline:
                return not self.path.exists()
            time.sleep(0.01)

    def _pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _own_pids_cgroups() -> list[Path]:
    """This process's own cgroup directory in each mounted hierarchy that has the pids
    controller (v1 ``pids``; v2 where its subtree has ``pids`` on), first v1 then v2."""
    try:
        own = dict(
            ln.split(":", 2)[1:] for ln in Path("/proc/self/cgroup").read_text().split("\n") if ln
        )
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except (OSError, ValueError):
        return []
    found = []
    for line in mounts:
        pre, _, post = line.partition(" - ")
        fields, fstype = pre.split(" "), post.split(" ")[0]
        if len(fields) < 5 or fstype not in ("cgroup", "cgroup2"):
            continue
        root, mount = fields[3], fields[4]
        opts = post.split(" ")[2].split(",") if len(post.split(" ")) > 2 else []
        if fstype == "cgroup" and "pids" in opts:
            key = next((k for k in own if "pids" in k.split(",")), None)
        else:
            key = "" if fstype == "cgroup2" and "" in own else None
        if key is None or not own[key].startswith(root):
            continue
        base = Path(mount) / own[key][len(root) :].lstrip("/")
        if fstype == "cgroup2" and not _delegates_pids(base):
            continue
        found.append((fstype == "cgroup2", base))
    return [base for _, base in sorted(found)]


def _delegates_pids(base: Path) -> bool:
    try:
        return "pids" in (base / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False
