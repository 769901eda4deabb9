"""The run directory: created, checked writable, and locked by the one job that uses it.

Two jobs in one ``run_dir`` would corrupt it: two redis-servers on one AOF, two learners
racing on one checkpoint directory. Each role a launcher runs takes an exclusive
``flock`` on ``<run_dir>/.lock-<role>`` (``asyncrl run`` takes buffer, learner and actors;
``asyncrl launch ROLE`` that role's), so roles on separate node groups may still share a
directory (say, on NFS) while a second job of the same role fails at once, naming the
process that holds the lock. The kernel drops a ``flock`` when the last process holding the
open file exits, so a crashed or SIGKILLed job leaves no stale lock; the launcher passes the
lock's file descriptor to the processes it starts, so the lock lasts as long as any of them.

``write_atomic`` is how the run directory's secrets (a launch token, URL files) are written:
a crash leaves the old file or the whole new one, never a part.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

_held: dict[str, int] = {}  # lock path -> fd, for this process's lifetime


class RunDirError(RuntimeError):
    """The run directory cannot be used; the message names the path and the fix."""


def prepare(run_dir: str, roles: tuple[str, ...]) -> Path:
    """Create ``run_dir`` (default ``runs/<timestamp>``), check it is writable and lock it
    for ``roles``; returns the absolute path."""
    path = Path(run_dir or time.strftime("runs/%Y%m%d-%H%M%S")).expanduser().resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise RunDirError(
            f"run_dir={path} is not usable: {describe_os_error(e)}; "
            "give a writable directory (run_dir=PATH)"
        ) from e
    for role in roles:
        lock(path, role)
    return path


def describe_os_error(e: OSError) -> str:
    """``no space left on device (writing /x/y)``-style text for an ``OSError``."""
    where = f" ({e.filename})" if e.filename else ""
    if e.errno == errno.ENOSPC:
        return f"no space left on the device of {e.filename or 'the run directory'}"
    if e.errno == errno.EROFS:
        return f"read-only file system{where}"
    return f"{e.strerror or e}{where}"


def lock(run_dir: Path, role: str) -> None:
    """Hold ``<run_dir>/.lock-<role>`` until this process (and the children it passes the
    lock to) exit; raise ``RunDirError`` naming the holder if another job has it."""
    path = run_dir / f".lock-{role}"
    if str(path) in _held:
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder_text(fd, path)
        os.close(fd)
        raise RunDirError(
            f"run_dir={run_dir} is in use: its {role} lock ({path.name}) is held by {holder}. "
            "Two jobs in one run directory would corrupt it (its Redis AOF, its checkpoints). "
            "Wait for that job to end or stop it, or give another run_dir=PATH"
        ) from None
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join(sys.argv[:1] + [a for a in sys.argv[1:] if "redis://" not in a]),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    os.set_inheritable(fd, True)
    _held[str(path)] = fd


def in_use(run_dir: Path, role: str) -> bool:
    """True while some process holds ``role``'s lock on ``run_dir`` (checked without taking
    it for longer than the check)."""
    path = Path(run_dir) / f".lock-{role}"
    if str(path) in _held:
        return True
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases a shared lock we may have taken


def held_fds() -> tuple[int, ...]:
    """The lock file descriptors this process holds (passed to the processes it starts)."""
    return tuple(_held.values())


def _holder_text(fd: int, path: Path) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        info = {}
    pid = info.get("pid")
    text = f"PID {pid}" if pid else "another process"
    if info.get("command"):
        text += f" (`{info['command']}`, started {info.get('started', '?')})"
    alive = _pids_holding(path)
    if pid and alive and pid not in alive:
        text += f"; that process is gone but processes it started still hold it: PIDs {alive}"
    return text


def _pids_holding(path: Path) -> list[int]:
    """PIDs with ``path`` open (a /proc scan; only for the error message)."""
    target = os.stat(path)
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                st = os.stat(fd)
                if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                    pids.append(int(entry.name))
                    break
        except OSError:  # gone, or not ours to read
            continue
    return sorted(pids)


def write_atomic(path: str | os.PathLike, data: str | bytes, mode: int = 0o600) -> None:
    """Replace ``path`` by a file holding ``data`` with permissions exactly ``mode`` (default
    0600: a secret). Readers and a crash see the old file or the whole new one, never a part:
    the data goes to a temporary file in the same directory (created 0600, so a secret is
    never readable by others, even briefly), is synced, then renamed over ``path``."""
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power loss
    finally:
        os.close(dir_fd)
