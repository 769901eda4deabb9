"""Run untrusted (model-written) Python code in a confined subprocess.

``run_untrusted(code, ...)`` runs ``code`` with a fresh interpreter (``python -I``) in a fresh
working directory and returns a ``SandboxResult`` (exit code, output, and a ``reason`` when
it failed). Layers, each applied where the kernel allows it (``SandboxResult.isolation``
lists the ones that were in force; ``require`` makes missing ones an error):

``rlimits``    RLIMIT_CPU (CPU seconds), RLIMIT_AS (memory), RLIMIT_FSIZE (largest file),
               RLIMIT_NOFILE, RLIMIT_CORE=0, and RLIMIT_NPROC (processes, counted inside the
               sandbox's own user namespace) against fork bombs. The kernel exempts uid 0
               from RLIMIT_NPROC: there a watchdog polls the process tree every 10 ms and
               kills the sandbox above ``max_procs`` (a bomb can overshoot between polls).
``cgroup``     a pids cgroup of its own (``asyncrl/actors/rewards/cgroup.py``) with ``pids.max=max_procs``:
               the process limit for root too, exact (forks fail at the limit, which counts
               threads and the confining bootstrap); where cgroups are writable.
``userns``     a new user namespace: no capabilities outside it.
``netns``      a new network namespace with no interface up: no network at all (TCP, UDP,
               abstract unix sockets of the host).
``pidns``      a new PID namespace: when the sandbox's first process dies, the kernel kills
               every process it started, so nothing outlives the call.
``landlock``   Landlock LSM: files may be written only under the working directory; files
               may be read only under the Python installation and system library paths
               (not the run directory: no Redis password, no checkpoints; not ``/proc``: no
               other process' environment); TCP bind/connect denied (ABI >= 4); signals to
               processes outside the sandbox denied (ABI >= 6).
``timeout``    a wall-clock limit; the whole sandbox is SIGKILLed when it is reached.

Not covered: path-named unix sockets (e.g. ``redis.sock``) can still be connected to if the
code knows the path (Redis still asks for the password, which it cannot read); CPU time is
limited per process (NPROC x CPU seconds in total at most, and the wall-clock limit kills
all of them). The child gets an empty environment (no ``ASYNCRL_*``, no credentials).

This module imports only the standard library: the child imports it to confine itself.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from asyncrl.actors.rewards.cgroup import PidsCgroup

__all__ = ["SandboxResult", "SandboxError", "run_untrusted", "available_isolation"]

_ROOT = str(Path(__file__).resolve().parents[3])  # the directory holding asyncrl/
_CLONE_NEWUSER, _CLONE_NEWNET, _CLONE_NEWPID = 0x10000000, 0x40000000, 0x20000000
_PR_SET_NO_NEW_PRIVS = 38
_SYS_LANDLOCK = {"create_ruleset": 444, "add_rule": 445, "restrict_self": 446}
# Landlock filesystem rights (linux/landlock.h)
_FS_EXECUTE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 2, 1 << 3
_FS_ALL_V1 = (1 << 13) - 1
_FS_REFER, _FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1
_READ_ONLY_ROOTS = ("/usr", "/lib", "/lib64", "/bin", "/sbin")
_DEV_FILES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
ALL_LAYERS = ("rlimits", "cgroup", "userns", "netns", "pidns", "landlock", "timeout")
_TEST_WITHOUT: tuple[str, ...] = ()
"""Tests only: layers the child reports missing, to act out a kernel without them."""


class SandboxError(RuntimeError):
    """The sandbox could not be set up as required (not: the code failed; see ``reason``)."""


@dataclass
class SandboxResult:
    """What happened. ``ok`` iff the code exited 0 within every limit."""

    returncode: int
    stdout: str
    stderr: str
    reason: str
    duration_s: float
    isolation: list[str] = field(default_factory=list)
    peak_procs: int = 0
    """Most processes seen at once in the sandbox's tree (10 ms polling; not the bootstrap)."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.reason


def run_untrusted(
    code: str,
    timeout_s: float = 10.0,
    mem_mb: int = 512,
    cpu_s: float = 5.0,
    workdir: str | os.PathLike | None = None,
    *,
    max_procs: int = 16,
    max_file_mb: int = 16,
    max_output_bytes: int = 1 << 20,
    require: tuple[str, ...] = (),
) -> SandboxResult:
    """Run ``code`` (Python source) confined; never raises for anything the code does.

    ``workdir``: the only directory the code may write (created if missing); None = a fresh
    temporary directory, removed afterwards. ``require``: layers (see the module docstring)
    that must be in force, else ``SandboxError`` (e.g. ``("netns", "landlock")``).
    """
    if timeout_s <= 0 or cpu_s <= 0 or mem_mb < 64 or max_procs < 1:
        raise ValueError("need timeout_s > 0, cpu_s > 0, mem_mb >= 64 and max_procs >= 1")
    unknown = set(require) - set(ALL_LAYERS)
    if unknown:
        raise ValueError(f"unknown isolation layers {sorted(unknown)}; known: {ALL_LAYERS}")
    with tempfile.TemporaryDirectory(prefix="asyncrl-sandbox-") as private:
        work = Path(workdir) if workdir is not None else Path(private) / "work"
        work.mkdir(parents=True, exist_ok=True)
        (work / "main.py").write_text(code)
        spec = {
            "workdir": str(work.resolve()),
            "mem_bytes": mem_mb << 20,
            "cpu_s": max(1, int(round(cpu_s))),
            "max_procs": max_procs,
            "file_bytes": max_file_mb << 20,
            "require": [layer for layer in require if layer != "timeout"],
            "without": list(_TEST_WITHOUT),
        }
        cgroup = None if "cgroup" in _TEST_WITHOUT else PidsCgroup.create(max_procs)
        spec["cgroup"] = str(cgroup.path) if cgroup else None
        try:
            return _supervise(spec, Path(private), timeout_s, max_output_bytes, cgroup)
        finally:
            if cgroup:
                cgroup.remove()


def _supervise(
    spec: dict, private: Path, timeout_s: float, max_out: int, cgroup: PidsCgroup | None
) -> SandboxResult:
    """Start the confining bootstrap, enforce the wall clock, collect the result."""
    out_path, err_path = private / "stdout", private / "stderr"
    info_r, info_w = os.pipe()
    boot = (
        f"import sys; sys.path.insert(0, {_ROOT!r}); "
        "from asyncrl.actors.rewards.sandbox import _bootstrap; _bootstrap()"
    )
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": spec["workdir"]}
    start = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-c", boot, json.dumps({**spec, "info_fd": info_w})],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=env,
            cwd=spec["workdir"],
            pass_fds=(info_w,),
            start_new_session=True,
        )
    os.close(info_w)
    info: dict = {}
    limit = _Limit(spec["max_procs"], cgroup)
    timed_out, peak, over = _watch(proc, info_r, info, start + timeout_s, limit)
    info.update(_read_info(info_r))
    _kill_all(proc, info.get("pid"))
    duration = time.monotonic() - start
    stdout, stderr = _tail(out_path, max_out), _tail(err_path, max_out)
    isolation = info.get("isolation", [])
    missing = [layer for layer in spec["require"] if layer not in isolation]
    if missing:  # the child refused to run the code (``_bootstrap``)
        raise SandboxError(
            f"sandbox layers {missing} are not available on this machine, so the code was not "
            f"run (in force: {isolation}; setup errors: {info.get('errors', stderr[-500:])}); "
            "run on a Linux kernel >= 5.13 with Landlock enabled and unprivileged user "
            "namespaces allowed (sysctl kernel.unprivileged_userns_clone=1, "
            "kernel.apparmor_restrict_unprivileged_userns=0), or drop them from `require`"
        )
    code = info.get("status", proc.returncode if proc.returncode is not None else -9)
    if over:
        reason = f"process limit: more than {spec['max_procs']} processes (all killed)"
    else:
        info["refused_forks"] = bool(cgroup and cgroup.refused_forks())
        reason = _reason(code, stderr, timed_out, timeout_s, spec, info)
    return SandboxResult(code, stdout, stderr, reason, duration, isolation + ["timeout"], peak)


@dataclass(frozen=True)
class _Limit:
    """The process limit the watchdog checks: ``cgroup`` refused a fork (exact), or the tree
    polled holds more than ``max_procs`` (as root without a cgroup: RLIMIT_NPROC is void)."""

    max_procs: int
    cgroup: PidsCgroup | None

    def exceeded(self, n: int) -> bool:
        return n > self.max_procs or bool(self.cgroup and self.cgroup.refused_forks())


def _watch(proc, info_fd: int, info: dict, deadline: float, limit: _Limit):
    """Wait for the bootstrap until ``deadline``, checking the process limit every 10 ms.
    Returns (timed_out, peak process count, over the limit)."""
    os.set_blocking(info_fd, False)
    peak = 0
    while proc.poll() is None:
        if "pid" not in info:
            info.update(_read_info(info_fd, close=False))
        if info.get("pid"):
            n = _count_tree(info["pid"])
            peak = max(peak, n)
            if limit.exceeded(n):
                return False, peak, True
        if time.monotonic() >= deadline:
            return True, peak, False
        time.sleep(0.01)
    return False, peak, False


def _count_tree(pid: int) -> int:
    """Processes in the tree rooted at ``pid`` (via /proc/PID/task/TID/children)."""
    n, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        n += 1
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except (OSError, ValueError):
                continue
    return n


def _read_info(fd: int, close: bool = True) -> dict:
    """The bootstrap's JSON lines (isolation layers, the sandbox pid, the exit status)."""
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, 65536):
            data += chunk
    except BlockingIOError:
        pass
    finally:
        if close:
            os.close(fd)
    info: dict = {}
    for line in data.decode(errors="replace").splitlines():
        try:
            info.update(json.loads(line))
        except ValueError:
            continue
    return info


def _kill_all(proc: subprocess.Popen, sandbox_pid: int | None) -> None:
    """SIGKILL the sandbox's first process (its PID namespace dies with it) and the group."""
    for pid in [sandbox_pid] if sandbox_pid else []:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    deadline = time.monotonic() + 5.0
    while sandbox_pid and _alive(sandbox_pid) and time.monotonic() < deadline:
        time.sleep(0.01)  # the kernel tears the PID namespace down asynchronously


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _tail(path: Path, limit: int) -> str:
    """The last ``limit`` bytes of ``path`` as text."""
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - limit))
        return f.read().decode(errors="replace")


def _reason(code: int, stderr: str, timed_out: bool, timeout_s: float, spec, info) -> str:
    """Why the run failed, in words ("" if it exited 0 in time)."""
    last = next((ln for ln in reversed(stderr.strip().splitlines()) if ln.strip()), "")
    if timed_out:
        return f"timeout: still running after {timeout_s:g}s wall clock (killed)"
    if info.get("setup_error"):
        return f"sandbox setup failed: {info['setup_error']}"
    if code == 0:
        return ""
    if code < 0 or code > 128:
        sig = -code if code < 0 else code - 128
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else sig
        if sig in (signal.SIGXCPU, signal.SIGKILL) and info.get("cpu_exceeded"):
            return f"cpu limit: used more than {spec['cpu_s']}s of CPU (killed by {name})"
        if sig == signal.SIGXCPU:
            return f"cpu limit: used more than {spec['cpu_s']}s of CPU (killed by {name})"
        if sig == signal.SIGXFSZ:
            return f"file size limit: wrote a file over {spec['file_bytes'] >> 20} MiB"
        return f"killed by signal {name}"
    if "MemoryError" in last:
        return f"memory limit: {spec['mem_bytes'] >> 20} MiB address space exceeded ({last})"
    refusal = ("BlockingIOError", "Resource temporarily unavailable", "can't start new thread")
    if info.get("refused_forks") or any(word in last for word in refusal):
        return f"process limit: more than {spec['max_procs']} processes ({last})"
    if "PermissionError" in last:
        return f"denied by the sandbox (files outside its directory, network) ({last})"
    if "Network is unreachable" in last or "ConnectionRefused" in last:
        return f"no network in the sandbox ({last})"
    return f"exit code {code}: {last}" if last else f"exit code {code}"


# -- the child side ------------------------------------------------------------------------------


def _bootstrap() -> None:
    """Child entry point: confine this process, fork the sandbox's first process, report."""
    spec = json.loads(sys.argv[1])
    info_fd = spec["info_fd"]

    def report(**kv) -> None:
        os.write(info_fd, (json.dumps(kv) + "\n").encode())

    layers, errors = [], {}
    _set_rlimits(spec)
    layers.append("rlimits")
    if spec["cgroup"]:
        try:  # first: while this process still has root's rights in the cgroupfs
            PidsCgroup(Path(spec["cgroup"])).join(os.getpid())
            layers.append("cgroup")
        except OSError as e:
            errors["cgroup"] = str(e)
    else:
        errors["cgroup"] = "no writable pids cgroup (needs root or a delegated pids controller)"
    libc = ctypes.CDLL(None, use_errno=True)
    for name, flag in (("userns", _CLONE_NEWUSER), ("netns", _CLONE_NEWNET)):
        if libc.unshare(flag) == 0:
            layers.append(name)
        else:
            errors[name] = os.strerror(ctypes.get_errno())
    if libc.unshare(_CLONE_NEWPID) == 0:
        layers.append("pidns")  # applies to the child forked below (its PID 1)
    else:
        errors["pidns"] = os.strerror(ctypes.get_errno())
    # Counted per user namespace: only the sandbox's own processes (it must be set after
    # unshare, or root's processes elsewhere would count).
    resource.setrlimit(resource.RLIMIT_NPROC, (spec["max_procs"], spec["max_procs"]))
    try:
        _landlock(spec["workdir"])
        layers.append("landlock")
    except OSError as e:
        errors["landlock"] = str(e)
    layers = [layer for layer in layers if layer not in spec["without"]]
    report(isolation=layers, errors=errors)
    if any(layer not in layers for layer in spec["require"]):
        sys.exit(0)  # a required layer is missing: never run the code (the parent raises)
    pid = os.fork()
    if pid == 0:
        os.close(info_fd)
        os.chdir(spec["workdir"])
        os.execv(sys.executable, [sys.executable, "-I", "main.py"])
    report(pid=pid)
    _, status = os.waitpid(pid, 0)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    report(status=code, cpu_exceeded=cpu >= spec["cpu_s"])
    sys.exit(0)


def _set_rlimits(spec: dict) -> None:
    """CPU seconds (SIGXCPU, then SIGKILL 1 s later), memory, file size, fds, no core dumps."""
    cpu = spec["cpu_s"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (spec["mem_bytes"], spec["mem_bytes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (spec["file_bytes"], spec["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _landlock_abi(libc) -> int:
    """The kernel's Landlock ABI version (0 = unavailable)."""
    abi = libc.syscall(_SYS_LANDLOCK["create_ruleset"], None, ctypes.c_size_t(0), 1)
    return max(0, abi)


def _landlock(workdir: str) -> None:
    """Restrict this process and its descendants: write under ``workdir`` only, read only
    the Python installation and system libraries, no TCP (ABI >= 4), no signals out (>= 6).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    abi = _landlock_abi(libc)
    if abi < 1:
        raise OSError("Landlock is not available (kernel < 5.13 or disabled at boot)")
    fs = _FS_ALL_V1 | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
    fs |= _FS_IOCTL_DEV if abi >= 5 else 0
    net = (_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 else 0
    scoped = (_SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL) if abi >= 6 else 0
    attr = struct.pack("QQQ", fs, net, scoped)[: 8 if abi < 4 else (16 if abi < 6 else 24)]
    ruleset = libc.syscall(_SYS_LANDLOCK["create_ruleset"], attr, ctypes.c_size_t(len(attr)), 0)
    if ruleset < 0:
        raise OSError(f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        read = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
        roots = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
        for path in sorted(roots | set(_READ_ONLY_ROOTS) | set(_DEV_FILES)):
            is_dir = os.path.isdir(path)
            _allow(libc, ruleset, path, read if is_dir else _FS_READ_FILE | (1 << 1))
        _allow(libc, ruleset, workdir, fs)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(f"prctl(NO_NEW_PRIVS): {os.strerror(ctypes.get_errno())}")
        if libc.syscall(_SYS_LANDLOCK["restrict_self"], ruleset, 0) != 0:
            raise OSError(f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)


def _allow(libc, ruleset: int, path: str, access: int) -> None:
    """Add a path-beneath rule (silently skips paths that do not exist)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return
    try:
        attr = struct.pack("=Qi", access, fd)  # struct landlock_path_beneath_attr (packed)
        if libc.syscall(_SYS_LANDLOCK["add_rule"], ruleset, 1, attr, 0) != 0:
            raise OSError(f"landlock_add_rule({path}): {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def available_isolation() -> list[str]:
    """The layers this machine supports (runs a trivial program in the sandbox)."""
    return run_untrusted("pass", timeout_s=30).isolation


if __name__ == "__main__":  # pragma: no cover - manual check
    print(available_isolation())
