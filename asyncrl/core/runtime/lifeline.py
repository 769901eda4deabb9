"""Children die with their parent, whatever kills it (``asyncrl run`` / ``asyncrl launch``).

A role (learner, actor) or the private redis-server started by the launcher runs as

    python -m asyncrl.core.runtime.lifeline --parent PID [--cores CORES] [--hold-sigterm] -- CMD [ARGS...]

which, before it ``exec``s CMD:

1. asks the kernel for SIGTERM when the thread that started it exits
   (``prctl(PR_SET_PDEATHSIG)``; kept across ``exec``), so a SIGKILLed or crashed launcher
   takes its roles with it: SIGTERM lets an actor stop its vLLM engine, torchrun stop its
   ranks and redis-server flush its AOF;
2. checks that its parent is still ``PID``: a launcher that died between ``fork`` and the
   ``prctl`` would otherwise leave an orphan (exit 1 at once);
3. pins itself to ``CORES`` (``sched_setaffinity``; inherited by everything CMD starts);
4. names the launcher in ``ASYNCRL_LIFELINE`` (PID and start time), so a role and its
   own children (torchrun's ranks) can ``watch_launcher``: a process still alive
   ``ORPHAN_GRACE_S`` after the launcher died writes every thread's stack to its log and
   exits. The SIGTERM asks for a clean stop, but its Python handler cannot run while the
   main thread is blocked in C (a gloo collective, a socket read) until that call's own
   deadline (``learner.weight_sync_timeout_s``: 120 s); the watchdog bounds that.

With ``--hold-sigterm`` (the private redis-server), CMD starts with SIGTERM blocked and gets
SIGINT (a clean shutdown for Redis too) as its death signal: a scheduler that signals every
process of a job at once (Slurm's ``scancel``, which reaches the processes of a step whatever
their session) must not stop the buffer before the roles that still write to it; the launcher
stops it itself (``SHUTDOWN``) once they let go (``buffer.stop_grace_s``).

A role also writes every thread's stack to its log on ``kill -USR1 PID`` and goes on
(``enable_stack_dumps``): where a role that went silent is waiting.

``preexec_fn`` could do the same but is unsafe in a process with threads (the log pumps).
The death signal goes to the role itself; its own children (torchrun's ranks, vLLM's engine
processes) are stopped by the role's SIGTERM handling, as on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import signal
import sys
import threading
import time
from pathlib import Path

_PR_SET_PDEATHSIG = 1
ENV = "ASYNCRL_LIFELINE"
ORPHAN_GRACE_S = 30.0
"""How long a role may outlive its launcher: the launcher itself gives its roles 20 s
between SIGTERM and SIGKILL (``launcher._GRACE_S``); an orphan's SIGTERM came at the same
moment as Redis's and the actors', so it gets a little more."""


def child_cmd(
    cmd: list[str], cores: str = "", parent: int | None = None, hold_sigterm: bool = False
) -> list[str]:
    """``cmd`` wrapped so that it dies with this process (and runs on ``cores``, if given;
    with SIGTERM blocked and SIGINT as its death signal if ``hold_sigterm``)."""
    pid = os.getpid() if parent is None else parent
    pin = ["--cores", cores] if cores else []
    hold = ["--hold-sigterm"] if hold_sigterm else []
    return [
        sys.executable,
        "-m",
        "asyncrl.core.runtime.lifeline",
        "--parent",
        str(pid),
        *pin,
        *hold,
        "--",
        *cmd,
    ]


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send ``sig`` to this process when its parent thread exits (Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")


def _start_time(pid: int) -> str | None:
    """``pid``'s start time (clock ticks since boot, /proc/PID/stat field 22), or None when
    it is gone or a zombie: together with the PID it names one process, not a reused PID."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the name in parentheses may hold spaces
    return None if fields[0] in "ZX" else fields[19]


def watch_launcher(grace_s: float = ORPHAN_GRACE_S, poll_s: float = 1.0) -> bool:
    """Exit this process ``grace_s`` after the launcher named in ``ASYNCRL_LIFELINE`` died,
    if it is still running then, first writing every thread's stack to stderr (the role's
    log) to show what held it. A daemon thread; False (nothing started) outside a lifeline."""
    pid, _, started = os.environ.get(ENV, "").partition(":")
    if not pid.isdigit() or not started:
        return False

    def watch() -> None:
        while _start_time(int(pid)) == started:
            time.sleep(poll_s)
        time.sleep(grace_s)
        sys.stderr.write(
            f"[asyncrl] the launcher (PID {pid}) died {grace_s:.0f}s ago and "
            f"this process (PID {os.getpid()}) has not stopped on its SIGTERM; "
            "exiting now. Its threads were here:\n"
        )
        sys.stderr.flush()
        faulthandler.dump_traceback(all_threads=True)
        os._exit(143)

    threading.Thread(target=watch, name="asyncrl-lifeline", daemon=True).start()
    return True


STACK_SIGNAL = signal.SIGUSR1
"""``kill -USR1 PID`` makes a role write every thread's stack to its log and go on."""


def enable_stack_dumps() -> None:
    """On ``STACK_SIGNAL``, write every thread's stack to stderr (the role's log) and go on:
    where a silent role is, without stopping it (``faulthandler``'s C handler, which runs even
    while the main thread is blocked in C). Roles call it at start (learner ranks, actors);
    the tests' process harness sends it to every process that catches it before it reports a
    timed-out wait (tests/roles.py)."""
    faulthandler.register(STACK_SIGNAL, file=sys.stderr, all_threads=True)


def catches_stack_signal(pid: int) -> bool:
    """True if process ``pid`` handles ``STACK_SIGNAL`` (/proc/PID/status ``SigCgt``): only
    those may be sent it, since its default action ends a process."""
    try:
        status = open(f"/proc/{pid}/status").read()
    except OSError:
        return False
    caught = next((ln.split()[1] for ln in status.splitlines() if ln.startswith("SigCgt:")), "0")
    return bool(int(caught, 16) >> (STACK_SIGNAL - 1) & 1)


def _parse(argv: list[str]) -> tuple[int, str, bool, list[str]]:
    """(parent, cores, hold_sigterm, cmd) from the command line of the module docstring."""
    usage = (
        "usage: python -m asyncrl.core.runtime.lifeline --parent PID [--cores CORES] "
        "[--hold-sigterm] -- CMD [ARGS...]"
    )
    if "--" not in argv:
        sys.exit(usage)
    split = argv.index("--")
    opts, cmd = argv[:split], argv[split + 1 :]
    hold = "--hold-sigterm" in opts
    opts = [o for o in opts if o != "--hold-sigterm"]
    values = dict(zip(opts[::2], opts[1::2], strict=False))
    if not cmd or "--parent" not in values or set(values) - {"--parent", "--cores"}:
        sys.exit(usage)
    return int(values["--parent"]), values.get("--cores", ""), hold, cmd


def main(argv: list[str]) -> None:
    parent, cores, hold, cmd = _parse(argv)
    if hold:  # the mask survives exec; the program's own SIGTERM handler then never runs
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    die_with_parent(signal.SIGINT if hold else signal.SIGTERM)
    if os.getppid() != parent:  # the launcher died before prctl took effect
        sys.exit(f"asyncrl.core.runtime.lifeline: parent {parent} is gone; not starting {cmd[0]}")
    os.environ[ENV] = f"{parent}:{_start_time(parent)}"
    if cores:
        from asyncrl.core.config.checks import parse_cores

        os.sched_setaffinity(0, parse_cores(cores))
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main(sys.argv[1:])


WORKER_STACK_WAIT_S = 0.5
"""How long ``worker_stacks`` waits for a worker's dump (faulthandler writes it at once)."""


async def worker_stacks(pid: int, path: str | Path) -> str:
    """Every thread's stack in worker ``pid`` now: it writes them to ``path`` on
    ``STACK_SIGNAL`` (``faulthandler.register(..., file=<path>)``; a reward or environment
    worker). A note when the process is gone or wrote nothing within ``WORKER_STACK_WAIT_S``."""
    import asyncio
    import time

    try:
        os.kill(pid, STACK_SIGNAL)
    except ProcessLookupError:
        return "(the worker process is gone)\n"
    deadline, text = time.monotonic() + WORKER_STACK_WAIT_S, ""
    while not text and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
        with contextlib.suppress(OSError):
            text = Path(path).read_text()
    return text or "(the worker process did not report its stacks)\n"


TREE_ENV = "ASYNCRL_PROCESS_TREE"
"""Set to a fresh token in a reward or environment worker's environment (``tagged_env``):
everything the worker starts inherits it, so ``kill_tree`` finds those processes even in
sessions of their own and after they were re-parented (the cookie Jenkins' ProcessTreeKiller
uses, ``BUILD_ID``)."""


ROLE_TREE_ENV = "ASYNCRL_ROLE_TREE"
"""The same for a whole role (the launcher's ``spawn``): what a role left behind, its
workers' children included, is found by it after the role died (``kill_tagged``)."""


def tagged_env(env: dict[str, str], var: str = TREE_ENV) -> tuple[dict[str, str], str]:
    """``env`` with ``var`` set to a new token, and the token."""
    import secrets

    tag = secrets.token_hex(8)
    return {**env, var: tag}, tag


def kill_tree(proc, tag: str = "") -> int:
    """SIGKILL the ``subprocess.Popen`` ``proc`` (a worker) and everything it started: its
    descendants, its session's process group, and, with ``tag`` (``tagged_env``), every
    process of this user whose environment carries it, whether the worker lives or died first
    (a reward's ``Popen(..., start_new_session=True)`` leaves its session's group, and outlives
    a crashed worker, re-parented). A process that cleared its environment and left the
    worker's tree escapes. Returns how many processes other than ``proc`` were signalled."""

    import psutil  # type: ignore[import-untyped]

    found: dict[int, psutil.Process] = {}
    if proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            found.update((p.pid, p) for p in psutil.Process(proc.pid).children(recursive=True))
    if tag:
        found.update((p.pid, p) for p in tagged(TREE_ENV, tag))
    found.pop(proc.pid, None)
    found.pop(os.getpid(), None)
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    return _sigkill_all(list(found.values()))


def _sigkill_all(procs: list) -> int:
    """SIGKILL each ``psutil.Process`` of ``procs`` (one gone meanwhile is skipped); how many."""
    import psutil

    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)
    return len(procs)


def tagged(var: str, tag: str) -> list:
    """This user's processes (``psutil.Process``) whose environment has ``var=tag``."""
    import psutil

    uid, out = os.getuid(), []
    for p in psutil.process_iter(["uids"]):
        try:
            if p.info["uids"] is None or p.info["uids"].real != uid:
                continue
            if p.environ().get(var) == tag:
                out.append(p)
        except psutil.Error:
            continue
    return out


def kill_tagged(var: str, tag: str) -> int:
    """SIGKILL every process of this user whose environment has ``var=tag`` (not this one);
    returns how many."""
    return _sigkill_all([p for p in tagged(var, tag) if p.pid != os.getpid()])
