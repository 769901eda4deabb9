"""An exclusive ``flock`` taken with a reported, bounded wait: one process builds a cached
artifact (a converted GGUF model, the demo model's warm start) while the others wait for it and
then reuse what it wrote.

The kernel drops a ``flock`` when its file is closed or its process dies, so a killed builder
never leaves the lock held; the caller re-checks for the finished artifact once it holds the
lock. Invariant: a waiter prints a line at the start and every 15 s (``Wait``), and gives up
after ``timeout_s`` naming the lock file.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Callable
from typing import IO

from asyncrl.core.runtime.waiting import Wait, never

POLL_S = 0.2
"""Seconds between two tries of a held lock."""


def take_lock(
    file: IO,
    what: str,
    say: Callable[[str], None],
    timeout_s: float,
    stop: Callable[[], bool] = never,
) -> None:
    """Take an exclusive ``flock`` on the open ``file``; while another process holds it, wait
    (``what``: the noun phrase the progress lines name) at most ``timeout_s``."""
    wait = None
    while True:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if wait is None:
                wait = Wait(
                    what,
                    timeout_s,
                    say,
                    stop=stop,
                    hint=f"remove {file.name} if no process holds it (fuser {file.name})",
                )
                wait.begin()
            wait.check()
            time.sleep(POLL_S)
