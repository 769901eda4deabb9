"""Processes a test starts (roles, launchers, helpers), watched while the test waits.

A test that waits on one process while another has died must not wait for its deadline: it
fails within ``POLL_S`` of the death, naming the dead process, how it ended and the tail of
its log (a learner once waited 600 s for an actor that had died at start). Every test
that starts processes and waits on them goes through ``Roles``::

    roles = Roles(tmp_path)                  # or the ``roles`` fixture (tests/conftest.py)
    buf = roles.cli("buffer", "launch", "buffer", f"run_dir={d}")
    roles.wait_until(lambda: url_file.is_file(), 300, "the buffer's URL file")
    learner = roles.cli("learner", "launch", "learner", ...)
    assert roles.wait(learner, 900) == 0, learner.tail()

Rules (``Roles.check``): a watched process that exits with a non-zero code or a signal fails
the wait at once; an exit with code 0 is fine only for processes started with
``may_exit=True`` (e.g. actors, which leave when the learner says stop). ``wait(p)`` and
``kill(p)`` stop watching ``p``: its exit is then the test's business. On teardown every
process (and all its descendants: torchrun ranks and vLLM engines live in sessions of their
own) gets SIGINT, then SIGKILL after a grace period.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from asyncrl.orchestration.launch.launcher import describe_exit, process_tree, send_signal

REPO = Path(__file__).resolve().parents[1]
POLL_S = 0.2
"""How often a wait looks at its condition and at every watched process."""
TAIL_LINES = 40


class RoleDied(AssertionError):
    """A watched process ended while the test waited for something else."""


@dataclass
class Proc:
    """One started process: its ``Popen``, its log file (stdout and stderr)."""

    name: str
    popen: subprocess.Popen
    log: Path
    may_exit: bool = False
    """An exit with code 0 is expected (the process finishes its own work)."""
    watched: bool = True

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def output(self) -> str:
        """Everything the process wrote so far."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = TAIL_LINES) -> str:
        return "".join(self.output().splitlines(True)[-lines:])

    def describe(self) -> str:
        """``'actors' exited with code 1; last lines of LOG:`` and the tail."""
        code = self.poll()
        how = "is running" if code is None else describe_exit(code)
        return f"{self.name!r} (pid {self.pid}) {how}; last lines of {self.log}:\n{self.tail()}"


class Roles:
    """The processes of one test; see the module docstring."""

    def __init__(self, log_dir: Path, grace_s: float = 60.0) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.grace_s = grace_s
        self.procs: list[Proc] = []

    def __enter__(self) -> Roles:
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()

    # -- starting -------------------------------------------------------------------------------

    def start(
        self,
        name: str,
        cmd: list[str],
        env: dict | None = None,
        cwd: Path = REPO,
        may_exit: bool = False,
        log: Path | None = None,
    ) -> Proc:
        """Start ``cmd`` in a session of its own, its output appended to ``log`` (default
        ``<log_dir>/<name>.log``)."""
        log = log or self.log_dir / f"{name}.log"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        with open(log, "ab") as out:  # the child keeps its own descriptor
            popen = subprocess.Popen(
                cmd, cwd=cwd, env=full_env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        proc = Proc(name, popen, log, may_exit)
        self.procs.append(proc)
        return proc

    def cli(self, name: str, *args: str, **kw) -> Proc:
        """``python -m asyncrl.orchestration.cli ARGS`` (the ``asyncrl`` command); ``kw`` as for ``start``."""
        return self.start(name, [sys.executable, "-m", "asyncrl.orchestration.cli", *args], **kw)

    def python(self, name: str, *args: str, **kw) -> Proc:
        """``python ARGS`` (``-m module ...`` or a script path); ``kw`` as for ``start``."""
        return self.start(name, [sys.executable, *args], **kw)

    # -- watching -------------------------------------------------------------------------------

    def check(self) -> None:
        """Raise ``RoleDied`` if a watched process ended in a way the test did not expect."""
        for p in self.procs:
            code = p.poll() if p.watched else None
            if code is None or (code == 0 and p.may_exit):
                continue
            p.watched = False  # report a death once
            raise RoleDied(f"{p.describe()}\n(it ended while the test waited for something else)")

    def wait_until(
        self, pred: Callable[[], object], timeout_s: float, what: str, poll_s: float = POLL_S
    ):
        """Poll ``pred`` until it is truthy (returned); fail on a death or after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = pred()
            if value:
                return value
            self.check()
            if time.monotonic() > deadline:
                dumped = self.dump_stacks()  # the tails below then show where each waited
                raise AssertionError(
                    f"timed out after {timeout_s:.0f}s waiting for {what} ({dumped} process(es) "
                    f"wrote their threads' stacks to their logs)\n{self._alive()}"
                )
            time.sleep(poll_s)

    def wait(self, proc: Proc, timeout_s: float) -> int:
        """``proc``'s exit code, watching the others meanwhile; on timeout fail with its tail."""
        proc.watched = False
        try:
            self.wait_until(lambda: proc.poll() is not None, timeout_s, f"{proc.name} to exit")
        except AssertionError as e:
            if isinstance(e, RoleDied):
                raise
            raise AssertionError(f"{e}\n{proc.describe()}") from None
        return proc.popen.returncode

    def wait_line(self, proc: Proc, needle: str, timeout_s: float) -> str:
        """The first line of ``proc``'s log that contains ``needle`` (``proc`` must live)."""

        def found() -> str | None:
            return next((ln for ln in proc.output().splitlines() if needle in ln), None)

        return self.wait_until(found, timeout_s, f"{needle!r} in {proc.log}")

    def dump_stacks(self, settle_s: float = 1.0) -> int:
        """Have every process of the live procs' trees that catches ``STACK_SIGNAL`` (the
        roles: asyncrl/core/runtime/lifeline.py) write its threads' stacks to its log, so that a
        timed-out wait shows where each waited; returns how many were asked."""
        from asyncrl.core.runtime.lifeline import STACK_SIGNAL, catches_stack_signal

        asked = 0
        for proc in self.procs:
            if proc.poll() is not None:
                continue
            for p in process_tree(proc.pid):
                if catches_stack_signal(p.pid):
                    send_signal(p, STACK_SIGNAL)
                    asked += 1
        if asked:
            time.sleep(settle_s)  # faulthandler writes at once; this is slack
        return asked

    def _alive(self) -> str:
        return "\n".join(p.describe() for p in self.procs if p.poll() is None and p.watched)

    # -- stopping -------------------------------------------------------------------------------

    def expect_exit(self, *procs: Proc) -> None:
        """From now on an exit with code 0 of these is expected (e.g. after a stop message);
        a non-zero exit still fails a wait."""
        for p in procs:
            p.may_exit = True

    def release(self, proc: Proc) -> None:
        """Stop watching ``proc`` (the test is about to end it, or its exit is expected)."""
        proc.watched = False

    def signal(self, proc: Proc, sig: int = signal.SIGKILL, timeout_s: float = 10.0) -> int:
        """Stop watching ``proc``, send it ``sig`` and return its exit code once it exited
        (bounded by ``timeout_s``)."""
        self.release(proc)
        if proc.poll() is None:
            proc.popen.send_signal(sig)
        return proc.popen.wait(timeout_s)

    def kill(self, proc: Proc) -> int:
        """SIGKILL ``proc`` (its descendants are not signalled: see ``kill_tree``)."""
        return self.signal(proc, signal.SIGKILL)

    def kill_tree(self, proc: Proc) -> None:
        """SIGKILL ``proc`` and every descendant (sessions of their own included)."""
        self.release(proc)
        tree = process_tree(proc.pid)
        for p in tree:
            send_signal(p, signal.SIGKILL)
        _wait_trees([proc], tree, 10.0)

    def stop_all(self) -> None:
        """SIGINT every process tree, SIGKILL what is left after ``grace_s``; reap all."""
        live = [p for p in self.procs if p.poll() is None]
        trees = [q for p in live for q in process_tree(p.pid)]
        for p in live:  # Ctrl-C, as a user would; each stops its own children
            with contextlib.suppress(ProcessLookupError):
                p.popen.send_signal(signal.SIGINT)
        for q in _wait_trees(live, trees, self.grace_s if live else 0.0):
            send_signal(q, signal.SIGKILL)
        _wait_trees(live, trees, 10.0)
        for p in self.procs:
            p.watched = False
            _reap(p)


def cmdline(proc) -> str:
    """The command line of ``proc`` (a pid or a ``psutil.Process``) as one string; "" once it
    has exited."""
    pid = proc if isinstance(proc, int) else proc.pid
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _wait_trees(roots: list[Proc], trees: list, timeout_s: float) -> list:
    """Wait up to ``timeout_s`` for ``roots`` (through ``Popen``, which keeps their exit codes:
    psutil would reap our children and lose them) and the rest of ``trees`` (through psutil);
    returns the ``psutil.Process`` of every one still alive."""
    import psutil

    deadline = time.monotonic() + timeout_s
    for p in roots:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.popen.wait(max(0.0, deadline - time.monotonic()))
    ours = {p.pid: p for p in roots}
    rest = [q for q in trees if q.pid not in ours]
    _, alive = psutil.wait_procs(rest, timeout=max(0.0, deadline - time.monotonic()))
    return [q for q in trees if q.pid in ours and ours[q.pid].poll() is None] + alive


def _reap(proc: Proc) -> None:
    try:
        proc.popen.wait(5)
    except subprocess.TimeoutExpired:
        proc.popen.kill()
        proc.popen.wait(5)
