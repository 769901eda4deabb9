"""asyncrl.core.runtime.lifeline: a role outlives a dead launcher by a bounded time, even when it cannot act
on its SIGTERM. Real processes: a launcher, the lifeline, a role that ignores SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from asyncrl.core.runtime import lifeline

# a role whose SIGTERM handler never runs (as when its main thread is blocked in C)
ROLE = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "from asyncrl.core.runtime.lifeline import watch_launcher; "
    "print('watching' if watch_launcher(grace_s=1.0, poll_s=0.1) else 'not watching', "
    "flush=True); time.sleep(60)"
)
# a launcher: starts the role under the lifeline, says its PID, then waits to be killed
LAUNCHER = (
    "import subprocess, sys, time; from asyncrl.core.runtime.lifeline import child_cmd; "
    "p = subprocess.Popen(child_cmd([sys.executable, '-c', sys.argv[1]]), "
    "stderr=open(sys.argv[2], 'w')); print(p.pid, flush=True); time.sleep(60)"
)


def _gone(pid: int) -> bool:
    return lifeline._start_time(pid) is None


def _kill_and_wait_gone(launcher: subprocess.Popen, child: int, timeout_s: float = 10) -> bool:
    """SIGKILL ``launcher``; whether ``child`` is gone within ``timeout_s`` after."""
    launcher.kill()
    launcher.wait(10)
    deadline = time.monotonic() + timeout_s
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _gone(child)


def test_a_role_that_ignores_sigterm_exits_soon_after_its_launcher_is_killed(tmp_path):
    err = tmp_path / "role.err"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, ROLE, str(err)],
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
    role = 0
    try:
        role = int(launcher.stdout.readline())
        assert launcher.stdout.readline().strip() == "watching"  # the role's stdout: inherited
        time.sleep(1.5)  # past the grace: alive while the launcher is
        assert not _gone(role), "the role left while its launcher was alive"
        assert _kill_and_wait_gone(launcher, role), "the role outlived its launcher by 10 s"
        text = err.read_text()
        assert f"the launcher (PID {launcher.pid}) died" in text, text
        assert "time.sleep" in text or 'File "<string>"' in text, text  # its stack, dumped
    finally:
        launcher.kill()
        if role and not _gone(role):
            os.kill(role, signal.SIGKILL)


def test_outside_a_lifeline_nothing_is_watched(monkeypatch):
    monkeypatch.delenv(lifeline.ENV, raising=False)
    assert lifeline.watch_launcher(grace_s=0.1) is False


@pytest.mark.parametrize("value", ["", "123", "abc:1", ":5"])
def test_a_malformed_lifeline_variable_watches_nothing(monkeypatch, value):
    monkeypatch.setenv(lifeline.ENV, value)
    assert lifeline.watch_launcher(grace_s=0.1) is False


def test_start_time_names_a_live_process_and_not_a_zombie():
    assert lifeline._start_time(os.getpid()) is not None
    child = os.fork()
    if child == 0:
        os._exit(0)
    # wait for its exit without reaping it (WNOWAIT): a zombie now, however loaded the machine
    # (a fixed 0.5 s sleep was once too short under CI's load)
    os.waitid(os.P_PID, child, os.WEXITED | os.WNOWAIT)
    try:
        assert lifeline._start_time(child) is None
    finally:
        os.waitpid(child, 0)
    assert lifeline._start_time(child) is None  # reaped: gone


def test_a_role_writes_its_stacks_on_the_signal_and_goes_on(tmp_path):
    """``kill -USR1 PID``: every thread's stack in the role's log, and it goes on; only a
    process that catches the signal is reported as catching it."""
    code = (
        "from asyncrl.core.runtime.lifeline import enable_stack_dumps; import time\n"
        "def in_a_long_call():\n    time.sleep(60)\n"
        "enable_stack_dumps(); print('up', flush=True); in_a_long_call()"
    )
    with open(tmp_path / "err", "w") as err:
        role = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=err, text=True
        )
    try:
        assert role.stdout.readline().strip() == "up"
        assert lifeline.catches_stack_signal(role.pid)
        plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            assert not lifeline.catches_stack_signal(plain.pid)  # a process that does not
        finally:
            plain.kill()
            plain.wait(10)
        os.kill(role.pid, lifeline.STACK_SIGNAL)
        deadline = time.monotonic() + 10
        while "in_a_long_call" not in (tmp_path / "err").read_text():
            assert time.monotonic() < deadline, (tmp_path / "err").read_text()
            time.sleep(0.1)
        time.sleep(0.3)
        assert role.poll() is None  # it goes on
    finally:
        role.kill()
        role.wait(10)


# a launcher of a --hold-sigterm child that prints its SigBlk mask and waits for SIGINT
HELD = (
    "import signal, sys, time; "
    "signal.signal(signal.SIGINT, lambda *_: (print('sigint', flush=True), sys.exit(0))); "
    "blk = [l for l in open('/proc/self/status') if l.startswith('SigBlk:')][0].split()[1]; "
    "print(int(blk, 16) >> (signal.SIGTERM - 1) & 1, flush=True); time.sleep(60)"
)


def test_hold_sigterm_blocks_sigterm_and_dies_with_its_parent_by_sigint(tmp_path):
    """The private redis-server's wrapping: a SIGTERM (Slurm's scancel reaches every process
    of a step) stays pending, and the launcher's death still stops it, by SIGINT."""
    out = tmp_path / "child.out"
    launcher_code = (
        "import subprocess, sys, time; from asyncrl.core.runtime.lifeline import child_cmd; "
        "p = subprocess.Popen(child_cmd([sys.executable, '-c', sys.argv[1]], hold_sigterm=True), "
        "stdout=open(sys.argv[2], 'w')); print(p.pid, flush=True); time.sleep(60)"
    )
    launcher = subprocess.Popen([sys.executable, "-c", launcher_code, HELD, str(out)],
                                stdout=subprocess.PIPE, text=True)  # fmt: skip
    child = 0
    try:
        child = int(launcher.stdout.readline())
        deadline = time.monotonic() + 20
        while not out.read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert out.read_text().split() == ["1"], out.read_text()  # SIGTERM blocked
        os.kill(child, signal.SIGTERM)
        time.sleep(0.5)
        assert not _gone(child), "a held SIGTERM stopped the child"
        assert _kill_and_wait_gone(launcher, child), "the child outlived its launcher"
        assert out.read_text().split() == ["1", "sigint"], out.read_text()
    finally:
        launcher.kill()
        if child and not _gone(child):
            os.kill(child, signal.SIGKILL)


def test_the_hold_flag_is_parsed_anywhere_before_the_command():
    assert lifeline._parse(["--parent", "7", "--hold-sigterm", "--", "x", "--hold-sigterm"]) == (
        7, "", True, ["x", "--hold-sigterm"]
    )  # fmt: skip
    assert lifeline._parse(["--cores", "0", "--parent", "7", "--", "x"]) == (7, "0", False, ["x"])
