"""Children die with their parent, whatever kills it (``asyncrl run`` / ``asyncrl launch``).

A role (learner, actor) or the private redis-server started by the launcher runs as

    python -m asyncrl.lifeline --parent PID [--cores CORES] -- CMD [ARGS...]

which, before it ``exec``s CMD:

1. asks the kernel for SIGTERM when the thread that started it exits
   (``prctl(PR_SET_PDEATHSIG)``; kept across ``exec``), so a SIGKILLed or crashed launcher
   takes its roles with it: SIGTERM lets an actor stop its vLLM engine, torchrun stop its
   ranks and redis-server flush its AOF;
2. checks that its parent is still ``PID``: a launcher that died between ``fork`` and the
   ``prctl`` would otherwise leave an orphan (exit 1 at once);
3. pins itself to ``CORES`` (``sched_setaffinity``; inherited by everything CMD starts).

``preexec_fn`` could do the same but is unsafe in a process with threads (the log pumps).
The death signal goes to the role itself; its own children (torchrun's ranks, vLLM's engine
processes) are stopped by the role's SIGTERM handling, as on Ctrl-C.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def child_cmd(cmd: list[str], cores: str = "", parent: int | None = None) -> list[str]:
    """``cmd`` wrapped so that it dies with this process (and runs on ``cores``, if given)."""
    pid = os.getpid() if parent is None else parent
    pin = ["--cores", cores] if cores else []
    return [sys.executable, "-m", "asyncrl.lifeline", "--parent", str(pid), *pin, "--", *cmd]


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send ``sig`` to this process when its parent thread exits (Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")


def _parse(argv: list[str]) -> tuple[int, str, list[str]]:
    usage = "usage: python -m asyncrl.lifeline --parent PID [--cores CORES] -- CMD [ARGS...]"
    if "--" not in argv:
        sys.exit(usage)
    split = argv.index("--")
    opts, cmd = argv[:split], argv[split + 1 :]
    values = dict(zip(opts[::2], opts[1::2], strict=False))
    if not cmd or "--parent" not in values or set(values) - {"--parent", "--cores"}:
        sys.exit(usage)
    return int(values["--parent"]), values.get("--cores", ""), cmd


def main(argv: list[str]) -> None:
    parent, cores, cmd = _parse(argv)
    die_with_parent()
    if os.getppid() != parent:  # the launcher died before prctl took effect
        sys.exit(f"asyncrl.lifeline: parent {parent} is gone; not starting {cmd[0]}")
    if cores:
        from asyncrl.config import parse_cores

        os.sched_setaffinity(0, parse_cores(cores))
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
