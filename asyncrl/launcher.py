"""Start roles as processes and supervise them (``asyncrl run`` / ``asyncrl launch``).

    asyncrl run
      ├─ buffer:  private redis-server in <run_dir>/redis (unless buffer.url is set)
      ├─ learner: torchrun --nproc_per_node=N -m learner.main     (FSDP2 ranks)
      └─ actors:  K x python -m actors.main                        (one vLLM engine each)
    learner rank 0 <──ZeroMQ control + weight collective──> actors
    actors ──groups (Redis Streams, Arrow)──> learner

A role that exits non-zero stops the whole job, and ``asyncrl run`` exits non-zero with the
role, its exit code (or the signal that killed it) and the tail of its log, unless the role
may be restarted: with ``actor.restart_max=N`` (``learner.restart_max=N``) a dead actor (the
learner) is started again, after a short growing backoff, up to N times (each restart is
printed, counted in the launcher's ``asyncrl_launcher_role_restarts_total{role}`` and in
``run.json`` / ``summary.json``). A restarted actor resumes its prompt cursor
(actors/actor.py); a restarted learner resumes from its newest checkpoint. Ctrl-C (SIGINT) or
SIGTERM stops every role cleanly.

Core pinning (``learner.cpu_affinity``, ``actor.cpu_affinity``): the role's command is wrapped
in ``python -m asyncrl.launcher pin CORES -- CMD``, which calls ``sched_setaffinity`` and
``exec``s the command, so the role and every process it starts (torchrun ranks, vLLM engine
core and workers) inherit the core set. ``preexec_fn`` would do the same but is unsafe in a
process with threads (the log pumps).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from asyncrl.torchrun import free_port

_GRACE_S = 20.0
_BACKOFF_S = (0.5, 10.0)  # first restart's delay, cap; doubles with each restart of a role


@dataclass
class Role:
    name: str
    proc: subprocess.Popen
    log_path: Path
    respawn: Callable[[], subprocess.Popen] | None = None
    """Starts the role's command again (same log file); None = cannot be restarted."""
    restart_max: int = 0
    """How many times ``supervise`` may restart this role after it died (0 = fail the job)."""
    restart_key: str = ""
    """The config key that sets ``restart_max`` (named in the failure message)."""
    restarts: int = 0


def role_env(cfg, redis_url: str, threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        ASYNCRL_REDIS_URL=redis_url,
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    return env


def _pump(proc: subprocess.Popen, log_path: Path, show) -> None:
    """Copy a child's output to its log file; echo the lines ``show`` selects."""
    with open(log_path, "a", buffering=1) as log:
        for line in proc.stdout:
            log.write(line)
            if show(line):
                sys.stdout.write(line)
                sys.stdout.flush()


def spawn(name: str, cmd: list[str], env: dict, run_dir: Path, show) -> Role:
    log_path = run_dir / f"{name}.log"
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # our Ctrl-C handling signals the whole role, once
    )
    threading.Thread(target=_pump, args=(proc, log_path, show), daemon=True).start()
    return Role(name, proc, log_path, respawn=lambda: spawn(name, cmd, env, run_dir, show).proc)


def learner_cmd(cfg, run_dir: Path, model_dir: str) -> list[str]:
    return [
        sys.executable, "-m", "asyncrl.torchrun",  # torchrun, rendezvous on loopback only
        f"--nproc_per_node={cfg.learner.nproc}", f"--master_port={free_port()}",
        "--master_addr=127.0.0.1", "-m", "learner.main",
        "--run-dir", str(run_dir), "--model-dir", model_dir,
    ]  # fmt: skip


def pinned(cmd: list[str], cores: str) -> list[str]:
    """``cmd`` restricted to the cores in ``cores`` (cpu-list syntax); '' = unchanged."""
    if not cores:
        return cmd
    return [sys.executable, "-m", "asyncrl.launcher", "pin", cores, "--", *cmd]


def actor_cmd(run_dir: Path, model_dir: str, actor_id: int) -> list[str]:
    return [
        sys.executable, "-m", "actors.main", "--run-dir", str(run_dir),
        "--model-dir", model_dir, "--actor-id", str(actor_id),
    ]  # fmt: skip


def show_progress(line: str) -> bool:
    return line.startswith(("step ", "[learner]", "[actor", "Traceback")) or "Error" in line[:80]


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(True)[-lines:])
    except OSError:
        return ""


def stop_roles(roles: list[Role]) -> None:
    """SIGTERM every live role and all its descendants, then SIGKILL what is left after a grace.

    Descendants are collected first and signalled one by one: torchrun starts each rank in a
    session of its own and vLLM spawns engine/worker processes, so signalling the role's
    process group alone can orphan them.
    """
    import psutil

    procs = []
    for r in roles:
        procs.extend(process_tree(r.proc.pid))
    for p in procs:
        send_signal(p, signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=_GRACE_S)
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
                if r.respawn and r.restarts < r.restart_max:
                    restart(r, code)
                    continue
                return code, failure_reason(r, code)
            if r.name == main:
                others = [o for o in roles if o is not r]
                _wait_all(others, _GRACE_S)
                return 0, ""
        if by_name[main].proc.poll() is None:
            time.sleep(0.5)


def kill_leftovers(r: Role) -> None:
    """SIGKILL what is left of a dead role's process group.

    Roles start in a session of their own (``spawn``), so the group id is the role's pid and
    outlives it while members remain: a SIGKILLed actor's vLLM engine core and workers would
    otherwise keep running, orphaned. (torchrun ranks run in sessions of their own; a dead
    rank makes torchrun exit, and ``stop_roles`` reaps the tree.)
    """
    try:
        os.killpg(r.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # nothing left (or not ours)
        pass


def describe_exit(code: int) -> str:
    """``exit code 3`` or ``killed by SIGKILL`` (Popen reports a signal as ``-signum``)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def failure_reason(r: Role, code: int) -> str:
    """Why the job failed: the role, how it ended, its restarts, and the tail of its log."""
    if r.restarts:
        budget = f" after {r.restarts} restart(s) ({r.restart_key}={r.restart_max} used up)"
    elif r.restart_key:
        budget = f" (set {r.restart_key}=N to restart it up to N times instead)"
    else:
        budget = ""
    return (
        f"{r.name} {describe_exit(code)}{budget}; last lines of {r.log_path}:\n"
        f"{log_tail(r.log_path)}"
    )


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


def _pin_main(argv: list[str]) -> None:
    """``python -m asyncrl.launcher pin CORES -- CMD...``: exec CMD on CORES only."""
    from asyncrl.config import parse_cores

    if len(argv) < 4 or argv[0] != "pin" or argv[2] != "--":
        sys.exit("usage: python -m asyncrl.launcher pin CORES -- CMD [ARGS...]")
    os.sched_setaffinity(0, parse_cores(argv[1]))
    os.execvp(argv[3], argv[3:])


if __name__ == "__main__":
    _pin_main(sys.argv[1:])
