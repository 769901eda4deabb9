"""``take_lock``: one holder at a time, a waiter that says what it waits for, gives up at its
deadline naming the lock file, and stops when asked."""

from __future__ import annotations

import fcntl
import threading

import pytest

from asyncrl.core.runtime.filelock import take_lock
from asyncrl.core.runtime.waiting import StopRequested


def test_a_free_lock_is_taken_at_once_and_silently(tmp_path):
    lines: list[str] = []
    with (tmp_path / "x.lock").open("w") as f:
        take_lock(f, "the builder", lines.append, timeout_s=1.0)
    assert lines == []


def test_a_held_lock_is_waited_for_then_taken(tmp_path):
    path, lines = tmp_path / "x.lock", []
    holder = path.open("w")
    fcntl.flock(holder, fcntl.LOCK_EX)
    took = threading.Event()

    def wait() -> None:
        with path.open("w") as f:
            take_lock(f, "the builder", lines.append, timeout_s=30.0)
            took.set()

    thread = threading.Thread(target=wait)
    thread.start()
    assert not took.wait(0.5)  # held: the waiter waits
    holder.close()  # the kernel drops the lock with its file
    thread.join(10)
    assert took.is_set() and lines and "waiting for the builder" in lines[0]


def test_a_lock_held_past_the_deadline_names_the_lock_file(tmp_path):
    path = tmp_path / "x.lock"
    with path.open("w") as holder, path.open("w") as f:
        fcntl.flock(holder, fcntl.LOCK_EX)
        with pytest.raises(TimeoutError, match=f"fuser {path}"):
            take_lock(f, "the builder", lambda _: None, timeout_s=0.3)
        with pytest.raises(StopRequested):
            take_lock(f, "the builder", lambda _: None, timeout_s=30.0, stop=lambda: True)
