"""Start roles as processes and supervise them (``asyncrl run`` / ``asyncrl launch``); which
processes a launch starts, in which order, is drawn in jobs.py, and each role's command and
environment are built in roles.py.

A role that exits non-zero stops the whole job, and ``asyncrl run`` exits non-zero with the
role, its exit code (or the signal that killed it) and the tail of its log, unless the role
may be restarted: with ``actor.restart_max=N`` (``learner.restart_max=N``) a dead actor (the
learner) is started again, after a short growing backoff, up to N times (each restart is
printed, counted in the launcher's ``asyncrl_launcher_role_restarts_total{role}`` and in
``run.json`` / ``summary.json``). A restarted actor resumes its prompt cursor
(actors/actor.py); a restarted learner resumes from its newest checkpoint. Ctrl-C (SIGINT) or
SIGTERM stops every role cleanly.

Every role's command is wrapped by ``asyncrl.core.runtime.lifeline`` (``child_cmd``): it dies with the
launcher, however the launcher ends (SIGKILL included), and runs on its configured cores
(``learner.cpu_affinity``, ``actor.cpu_affinity``; inherited by torchrun's ranks and vLLM's
engine processes). Roles inherit the run directory's lock (asyncrl/core/runtime/rundir.py). On a GPU node
torchrun and each actor get their own ``CUDA_VISIBLE_DEVICES`` (roles.py ``role_env``), from the
node's plan (asyncrl/orchestration/placement/plan.py, checked before anything starts).

A role's output is copied to ``<run_dir>/<role>.log`` and its last lines are kept in memory,
so a failure message shows them even when the log cannot be written (a full disk). Both are
bounded (role_log.py): the log rotates at ``role_log_max_mb`` keeping ``role_log_backups``
files, and a line longer than ``role_log_line_chars`` is cut in memory and on the console. A role
that fails with an error a restart cannot fix (asyncrl/core/runtime/fatal.py) is not restarted, and the
failure message says why instead of suggesting ``restart_max``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from asyncrl.core.runtime import fatal, rundir
from asyncrl.core.runtime.lifeline import ROLE_TREE_ENV, child_cmd, kill_tagged, tagged_env
from asyncrl.core.runtime.rundir import describe_os_error
from asyncrl.orchestration.launch.role_log import LineCut, LogLimits, RoleLog, parts
from asyncrl.orchestration.launch.stop_signals import hurried

_GRACE_S = 20.0
_ROOT_GRACE_S = 5.0  # a role's own process stops its children first
_ORPHAN_GRACE_S = 1.0  # then what it left behind is killed
_TAIL_LINES = 200
_BACKOFF_S = (0.5, 10.0)  # first restart's delay, cap; doubles with each restart of a role


@dataclass
class Role:
    name: str
    proc: subprocess.Popen | None
    log_path: Path
    respawn: Callable[[], subprocess.Popen] | None = None
    """Starts the role's command again (same log file); None = cannot be restarted."""
    restart_max: int = 0
    """How many times ``supervise`` may restart this role after it died (0 = fail the job)."""
    restart_key: str = ""
    """The config key that sets ``restart_max`` (named in the failure message)."""
    restarts: int = 0
    output: deque = field(default_factory=lambda: deque(maxlen=_TAIL_LINES))
    """The role's last output lines (kept in memory: the failure message needs them even when
    the log file cannot be written)."""
    log_error: OSError | None = None
    """Why the log file could not be written (its output is then only in ``output``)."""
    pump: threading.Thread | None = None
    """The thread copying the current process's output."""
    limits: LogLimits = field(default_factory=LogLimits)
    """How much of the output is kept (role_log.py)."""
    log_deleted_bytes: int = 0
    """Bytes of this role's log deleted by rotation (all its processes so far)."""
    cut_lines: int = 0
    """Lines longer than ``limits.line_chars``, cut in ``output`` and on the console."""
    rotation_said: bool = False
    """Whether the first rotation of this role's log was said (once per role)."""
    tree_tag: str = ""
    """``ROLE_TREE_ENV`` in the role's environment: inherited by all it starts, so
    ``kill_leftovers`` finds even what left its process group (asyncrl/core/runtime/lifeline.py)."""


def _pump(proc: subprocess.Popen, role: Role, show) -> None:
    """Copy a child's output to its (rotated) log file and its in-memory tail, reading at
    most ``role_log.CHUNK`` characters at once; echo what ``show`` selects. A log that cannot
    be written (disk full) is reported once and the pump goes on draining the pipe, so the
    child never blocks on a full pipe. Lines longer than ``limits.line_chars`` are cut in the
    tail and on the console (said once per role)."""
    log = _open_log(role)
    cut = LineCut(role.limits.line_chars, role.log_path.name)
    for piece in parts(proc.stdout):
        if log is not None:
            try:
                log.write(piece)
            except OSError as e:
                log = _log_failed(role, e, log)
        _keep(role, cut, cut.feed(piece), show)
    _keep(role, cut, cut.flush(), show)
    if log is not None:
        try:
            log.close()
        except OSError as e:
            _log_failed(role, e, None)


def _keep(role: Role, cut: LineCut, line: str | None, show) -> None:
    """One whole (possibly cut) line into the role's tail, echoed if ``show`` selects it."""
    if line is None:
        return
    if cut.last_cut:
        if not role.cut_lines:
            _echo(
                f"[asyncrl] {role.name} wrote a line longer than role_log_line_chars="
                f"{role.limits.line_chars}: the console and the failure messages show the first "
                f"{role.limits.line_chars} characters of such lines; {role.log_path} has them "
                "whole (counted in run.json's role_lines_cut)\n"
            )
        role.cut_lines += 1
    role.output.append(line)
    if show(line):
        _echo(line)


def _open_log(role: Role):
    def rotated(text: str) -> None:
        if not role.log_deleted_bytes and not role.rotation_said:  # once per role, restarts too
            _echo(f"[asyncrl] {role.name}: {text}\n")
        role.rotation_said = True

    try:
        return _CountedLog(role, rotated)
    except OSError as e:
        return _log_failed(role, e, None)


class _CountedLog(RoleLog):
    """A ``RoleLog`` that adds the bytes its rotations delete to its role's count."""

    def __init__(self, role: Role, rotated) -> None:
        super().__init__(role.log_path, role.limits, rotated)
        self.role = role

    def rotate(self) -> None:
        before = self.deleted_bytes
        try:
            super().rotate()
        finally:  # bytes deleted before a failure count too
            self.role.log_deleted_bytes += self.deleted_bytes - before


def _log_failed(role: Role, e: OSError, log) -> None:
    if role.log_error is None:
        role.log_error = e
        _echo(
            f"[asyncrl] cannot write {role.log_path}: {describe_os_error(e)}; "
            f"{role.name}'s output is kept only in memory (its last {_TAIL_LINES} lines)\n"
        )
    if log is not None:
        try:
            log.close()
        except OSError:
            pass


def _echo(line: str) -> None:
    try:
        sys.stdout.write(line)
        sys.stdout.flush()
    except (OSError, ValueError):  # our own stdout is gone (closed pipe): the log has it
        pass


def spawn(
    name: str,
    cmd: list[str] | Callable[[], list[str]],
    env: dict,
    run_dir: Path,
    show,
    cores: str = "",
    limits: LogLimits | None = None,
) -> Role:
    """Start ``cmd`` (or the command ``cmd()`` makes, fresh for each restart) as role
    ``name``, on ``cores``, dying with this process (asyncrl/core/runtime/lifeline.py); its
    output kept within ``limits`` (role_log.py; default ``LogLimits()``)."""
    role = Role(name, None, run_dir / f"{name}.log", limits=limits or LogLimits())
    env, role.tree_tag = tagged_env(env, ROLE_TREE_ENV)

    def start() -> subprocess.Popen:
        fatal.clear(run_dir, name)
        argv = cmd() if callable(cmd) else cmd
        proc = subprocess.Popen(
            child_cmd(argv, cores),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,  # our Ctrl-C handling signals the whole role, once
            pass_fds=rundir.held_fds(),  # the run directory stays locked while a role lives
        )
        role.pump = threading.Thread(target=_pump, args=(proc, role, show), daemon=True)
        role.pump.start()
        return proc

    role.proc, role.respawn = start(), start
    return role


def show_progress(line: str) -> bool:
    return (
        line.startswith(("step ", "validation v", "[learner]", "[actor", "[buffer]", "Traceback"))
        or "Error" in line[:80]
    )


def log_tail(r: Role, lines: int = 25) -> str:
    """The role's last output lines (from memory: right even when its log file is not), with
    torchrun's own report of a failed rank cut down to one line: the rank's traceback above
    it says what happened."""
    if r.pump is not None:
        r.pump.join(timeout=2.0)  # the pipe's last lines, after the process has exited
    return "".join(_without_torchrun_report(list(r.output))[-lines:])


_TORCHRUN_LOG = re.compile(r"^[WIE]\d{4} [\d:.]+ +\d+ .*torch/distributed/elastic/")


def _without_torchrun_report(lines: list[str]) -> list[str]:
    """Drop torchrun's agent traceback, its ``ChildFailedError`` box and its log lines;
    keep the box's root cause as one line."""
    kept = [ln for ln in lines if not _TORCHRUN_LOG.match(ln)]
    for i in range(len(kept) - 1, -1, -1):
        if kept[i].startswith("Traceback (most recent call last):") and any(
            "torch/distributed/run.py" in ln for ln in kept[i : i + 30]
        ):
            box = "".join(kept[i:])
            root = box.partition("Root Cause (first observed failure):")[2]
            rank = re.search(r"rank\s*:\s*(\d+)", root)
            code = re.search(r"exitcode\s*:\s*(-?\d+)", root)
            cause = f"rank {rank.group(1)}, exit code {code.group(1)}" if rank and code else "?"
            return kept[:i] + [f"(torchrun: a learner rank failed; first failure: {cause})\n"]
    return kept


def stop_roles(roles: list[Role]) -> None:
    """Stop every live role: SIGTERM to each role's own process first (an actor shuts its
    vLLM engine down, torchrun stops its ranks, each in its own order); what a role leaves
    behind once its own process is gone is SIGKILLed after ``_ORPHAN_GRACE_S`` (nothing
    coordinates it any more: e.g. a vLLM engine still starting when its actor died); a role
    still running after ``_ROOT_GRACE_S`` gets SIGTERM to all its descendants; after
    ``_GRACE_S`` in all (or at once after a second Ctrl-C, ``hurry``) what is left gets
    SIGKILL.

    The process trees are collected first and descendants signalled one by one: torchrun
    starts each rank in a session of its own and vLLM spawns engine/worker processes, so
    signalling the role's process group alone could orphan them.
    """
    import psutil

    trees = [tree for r in roles if (tree := process_tree(r.proc.pid))]
    for tree in trees:
        send_signal(tree[0], signal.SIGTERM)
    start = time.monotonic()
    stages = [_TreeStop(tree) for tree in trees]
    while any(s.alive for s in stages) and not hurried():
        if time.monotonic() - start > _GRACE_S:
            break
        for stage in stages:
            stage.advance(time.monotonic() - start)
        psutil.wait_procs([p for s in stages for p in s.alive], timeout=0.2)
    alive = [p for s in stages for p in s.alive]
    for p in alive:
        send_signal(p, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=10)
    for r in roles:
        try:
            r.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        if r.proc.poll() is not None:
            kill_leftovers(r)  # orphans of an earlier death of the role's process


class _TreeStop:
    """One role's process tree while ``stop_roles`` stops it (root = the role's process)."""

    def __init__(self, tree: list) -> None:
        self.root, self.rest = tree[0], tree[1:]
        self.root_gone_at: float | None = None
        self.told = False

    @property
    def alive(self) -> list:
        return [p for p in [self.root, *self.rest] if _running(p)]

    def advance(self, t: float) -> None:
        rest = [p for p in self.rest if _running(p)]
        if not _running(self.root):
            self.root_gone_at = t if self.root_gone_at is None else self.root_gone_at
            if rest and t - self.root_gone_at >= _ORPHAN_GRACE_S:
                for p in rest:
                    send_signal(p, signal.SIGKILL)
        elif t >= _ROOT_GRACE_S and not self.told:
            self.told = True
            for p in rest:
                send_signal(p, signal.SIGTERM)


def _running(p) -> bool:
    import psutil

    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def process_tree(pid: int) -> list:
    """``psutil.Process`` of ``pid`` and all its descendants ([] if it is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def send_signal(p, sig: int) -> None:
    """Signal a ``psutil.Process``; one that is gone (or not ours) is skipped."""
    try:
        p.send_signal(sig)
    except Exception:  # already gone (psutil.NoSuchProcess) or not ours to signal
        pass


def supervise(roles: list[Role], main: str) -> tuple[int, str]:
    """Wait for role ``main`` to finish; (0, "") on success, else (code, reason).

    A role that exits non-zero first fails the job, unless it may still be restarted
    (``Role.restart_max``): then it is started again after a backoff. When ``main`` succeeds
    the others get a grace period to finish (the learner tells actors to stop) and are then
    stopped.
    """
    by_name = {r.name: r for r in roles}
    while True:
        for r in roles:
            code = r.proc.poll()
            if code is None:
                continue
            if code != 0:
                kill_leftovers(r)
                cause = fatal.read(r.log_path.parent, r.name)
                if cause is None and r.respawn and r.restarts < r.restart_max:
                    restart(r, code)
                    continue
                return code, failure_reason(r, code, cause)
            if r.name == main:
                others = [o for o in roles if o is not r]
                _wait_all(others, _GRACE_S)
                return 0, ""
        if by_name[main].proc.poll() is None:
            time.sleep(0.5)


def kill_leftovers(r: Role) -> None:
    """SIGKILL what is left of a dead role: its process group and every process carrying
    its ``tree_tag``.

    Roles start in a session of their own (``spawn``), so the group id is the role's pid and
    outlives it while members remain: a SIGKILLed actor's vLLM engine core and workers would
    otherwise keep running, orphaned. What left the group (a reward's
    ``Popen(..., start_new_session=True)``, re-parented to init once its worker died) is found
    by the tag in its environment. (torchrun ranks run in sessions of their own; a dead
    rank makes torchrun exit, and ``stop_roles`` reaps the tree.)
    """
    try:
        os.killpg(r.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # nothing left (or not ours)
        pass
    if r.tree_tag:  # e.g. a reward's child in a session of its own, re-parented to init
        kill_tagged(ROLE_TREE_ENV, r.tree_tag)


def describe_exit(code: int) -> str:
    """``exit code 3`` or ``killed by SIGKILL`` (Popen reports a signal as ``-signum``)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def failure_reason(r: Role, code: int, cause: str | None = None) -> str:
    """Why the job failed: the role, how it ended, its restarts (or, for an error a restart
    cannot fix, that error), and the tail of its output."""
    if cause:
        budget = f": {cause}\n(a restart would fail the same way, so {r.name} was not restarted)"
    elif r.restarts:
        budget = f" after {r.restarts} restart(s) ({r.restart_key}={r.restart_max} used up)"
    elif r.restart_key:
        budget = f" (set {r.restart_key}=N to restart it up to N times instead)"
    else:
        budget = ""
    log = f"last lines of {r.log_path}"
    if r.log_error is not None:
        log = f"its last output (not in {r.log_path}: {describe_os_error(r.log_error)})"
    return f"{r.name} {describe_exit(code)}{budget}; {log}:\n{log_tail(r)}"


def restart(r: Role, code: int) -> None:
    """Start a dead role again after a backoff that doubles with each of its restarts."""
    r.restarts += 1
    delay = min(_BACKOFF_S[0] * 2 ** (r.restarts - 1), _BACKOFF_S[1])
    print(
        f"[asyncrl] {r.name} {describe_exit(code)}; restarting it in {delay:.1f}s "
        f"(restart {r.restarts} of {r.restart_max}, {r.restart_key})",
        flush=True,
    )
    time.sleep(delay)
    r.proc = r.respawn()


def _wait_all(roles: list[Role], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for r in roles:
        try:
            r.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    stop_roles(roles)
