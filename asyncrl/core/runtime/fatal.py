"""Errors a restart cannot fix, and how a role tells its launcher about one.

A role that dies of a bad config, unusable model files, a full or read-only disk, a
diverged loss or a reward function that keeps failing would die the same way after a
restart. Such a role records its error in ``<run_dir>/fatal-<role>.txt`` before it exits
(``recorded``); the launcher reads it (``read``), does not restart the role, and shows the
error as the job's failure reason, without suggesting ``restart_max``.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from pathlib import Path

_DISK_ERRNOS = (errno.ENOSPC, errno.EROFS, errno.EDQUOT)


class FatalError(RuntimeError):
    """An error a restart cannot fix; the message names the cause and the fix."""


def is_fatal(e: BaseException) -> bool:
    """True for ``FatalError`` and for a full, over-quota or read-only file system."""
    return isinstance(e, FatalError) or (isinstance(e, OSError) and e.errno in _DISK_ERRNOS)


def _path(run_dir: str | Path, role: str) -> Path:
    return Path(run_dir) / f"fatal-{role}.txt"


@contextlib.contextmanager
def recorded(run_dir: str | Path, role: str) -> Iterator[None]:
    """Record a fatal error escaping the block for the launcher (then re-raise it)."""
    try:
        yield
    except BaseException as e:
        if is_fatal(e):
            record(run_dir, role, e)
        raise


def record(run_dir: str | Path, role: str, e: BaseException) -> None:
    from asyncrl.core.runtime.rundir import describe_os_error

    text = describe_os_error(e) if isinstance(e, OSError) else str(e)
    try:
        _path(run_dir, role).write_text(text + "\n")
    except OSError:  # the disk is full: the launcher still has the log's last lines
        pass


def read(run_dir: str | Path, role: str) -> str | None:
    """The fatal error ``role`` recorded since it was (re)started, or None."""
    try:
        return _path(run_dir, role).read_text().strip() or None
    except OSError:
        return None


def clear(run_dir: str | Path, role: str) -> None:
    """Forget ``role``'s recorded error (before it is started again)."""
    with contextlib.suppress(OSError):
        _path(run_dir, role).unlink()
