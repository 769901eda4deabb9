"""A launcher's stop signals: the first Ctrl-C/SIGTERM stops the job, one while it is already
stopping hurries it (``stop_roles`` then SIGKILLs at once), except a SIGTERM right after the
first, which is the same request. Torch's import holds a signal until it is done.

Process-wide state: one launcher per process.
"""

from __future__ import annotations

import importlib
import os
import signal
import threading
import time
from collections.abc import Sequence

_hurry = threading.Event()
_stopping = threading.Event()


def begin_shutdown() -> None:
    """The job is stopping: a Ctrl-C/SIGTERM from now on hurries it (``on_stop_signal``)."""
    _stopping.set()


_first_signal_at: list[float] = []
REPEATED_SIGTERM_S = 3.0
"""A SIGTERM this soon after the first stop signal is the same request, not a hurry: Slurm
signals every process of a step and ``srun`` forwards the signal it got too, so one ``scancel``
reaches a launcher twice within milliseconds."""


def on_stop_signal(signum: int, frame) -> None:
    """SIGINT/SIGTERM handler of a launcher: the first signal raises ``KeyboardInterrupt``
    (the job stops its roles, then its buffer); a signal while it is already stopping does
    not interrupt that shutdown (which would orphan the buffer) but cuts its grace period:
    the roles get SIGKILL at once, and the buffer still gets its clean SHUTDOWN. A SIGTERM
    within ``REPEATED_SIGTERM_S`` of the first signal is taken as the same request."""
    now = time.monotonic()
    if not _stopping.is_set():
        _stopping.set()
        _first_signal_at[:] = [now]
        raise KeyboardInterrupt
    if (
        signum == signal.SIGTERM
        and _first_signal_at
        and now - _first_signal_at[0] < REPEATED_SIGTERM_S
    ):
        return
    if not _hurry.is_set():
        _hurry.set()
        os.write(2, b"[asyncrl] already stopping; killing the roles now (SIGKILL)\n")


def import_heavy_modules(names: Sequence[str] = ("torch", "transformers")) -> None:
    """Import ``names`` with Ctrl-C/SIGTERM held until the imports finish, then act on a
    signal that came meanwhile as ``on_stop_signal`` would.

    A ``KeyboardInterrupt`` raised inside torch's import (its C++ extension initialising) can
    abort the interpreter at exit (SIGABRT) or be lost in it, leaving the job running:
    tests/faults/test_job_lifecycle.py caught both under load. The imports take a few
    seconds, so a stop is deferred by that much at most. A launcher names only what its
    checks will import (preflight.py ``heavy_modules``): torch alone costs it ~2 CPU-s.
    """
    if not names:
        return
    held: list[int] = []
    old = {
        s: signal.signal(s, lambda n, _f: held.append(n)) for s in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        for name in names:
            importlib.import_module(name)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    if held:
        on_stop_signal(held[0], None)


def hurried() -> bool:
    """Whether a second Ctrl-C/SIGTERM came while stopping (``on_stop_signal``)."""
    return _hurry.is_set()


def hurry() -> None:
    """Make ``stop_roles`` SIGKILL at once instead of waiting out its grace period (a second
    Ctrl-C while the job is stopping)."""
    _hurry.set()
