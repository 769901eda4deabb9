"""Several "hosts" on one machine, made of Linux network namespaces, for multi-host tests.

::

    with Hosts(["learner0", "learner1", "actors", "redis", "outsider"]) as hosts:
        srv = hosts.popen("redis", ["redis-server", "--bind", hosts.addr("redis")])
        hosts.run("actors", ["python", "-c", "..."], timeout=30)
        with hosts.partitioned("learner1"):   # learner1 cut off from everyone, both ways
            ...
        hosts.kill_all("actors")              # SIGKILL every process in that namespace

Layout: one namespace per host (``<prefix>-<name>``) and one more, ``<prefix>-switch``, that
holds a Linux bridge. Host ``k`` (0-based, in the order given) has one interface, ``arl0``,
with the address ``10.<a>.<b>.<k+1>/24``; its veth peer ``arlp<k>`` is a port of the bridge
``arlbr``. Every interface is created directly inside its namespace, so the root namespace's
networking is never touched. Each namespace has ``lo`` up, so a host's ``127.0.0.1`` is its
own.

``<prefix>`` is ``arl<pid>.<seq>``, claimed through an ``flock``ed file in ``LOCK_DIR`` that
lives as long as the ``Hosts``: a new ``Hosts`` deletes the namespaces of prefixes whose lock
nobody holds any more (their owner died without ``close``, e.g. SIGKILLed by a timeout).
``10.<a>.<b>`` is derived from the pid and the sequence number, so parallel runs use different
subnets; as every bridge is private to its own switch namespace, a collision would be harmless.

A partition sets the host's bridge port (in the switch namespace, which the host's processes
cannot reach) down: the host's link loses its carrier, so nothing crosses in either direction,
established TCP connections included (they stall and retransmit, and resume on ``heal``).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

LOCK_DIR = Path("/run/asyncrl-netns")
"""One lock file per live ``Hosts`` (named by its prefix); see the module docstring."""
IP_TIMEOUT_S = 20.0
"""Deadline of one ``ip`` command."""
POLL_S = 0.02
HOST_IF = "arl0"
BRIDGE = "arlbr"
SWITCH = "switch"
MAX_HOSTS = 254
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")


class NetnsError(RuntimeError):
    """An ``ip`` command failed, or a namespace's processes or links did not settle in time."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``ip ARGS`` (bounded by ``IP_TIMEOUT_S``); raise ``NetnsError`` with its stderr if it
    fails and ``check``."""
    cmd = ["ip", *args]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise NetnsError(f"`{' '.join(cmd)}` did not finish within {IP_TIMEOUT_S:.0f}s") from None
    if check and r.returncode != 0:
        raise NetnsError(f"`{' '.join(cmd)}` failed ({r.returncode}): {r.stderr.strip()}")
    return r


@functools.lru_cache(maxsize=1)
def available() -> str | None:
    """``None`` if network namespaces, veth pairs and bridges can be made here, else the reason."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return f"network namespaces need root (euid is {os.geteuid()})"
    for tool in ("ip", "ss"):  # ss: the tests list each host's listening sockets
        if shutil.which(tool) is None:
            return f"no `{tool}` binary on PATH (apt-get install -y iproute2)"
    probe = f"arl{os.getpid()}-probe"
    _ip("netns", "del", probe, check=False)  # a leftover of a crashed probe by this pid
    try:
        _ip("netns", "add", probe)
        _ip("-n", probe, "link", "add", BRIDGE, "type", "bridge")
        _ip("-n", probe, "link", "add", "arlp0", "type", "veth", "peer", "name", HOST_IF)
    except NetnsError as e:
        return str(e)
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def namespaces() -> list[str]:
    """The names in ``ip netns list`` (every namespace, not only ours)."""
    out = _ip("netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def netns_pids(ns: str) -> list[int]:
    """The processes in namespace ``ns`` (``ip netns pids``; zombies are not listed)."""
    r = _ip("netns", "pids", ns, check=False)
    if r.returncode != 0:
        if ns not in namespaces():
            return []
        raise NetnsError(f"`ip netns pids {ns}` failed: {r.stderr.strip()}")
    return [int(p) for p in r.stdout.split()]


def kill_netns_pids(ns: str, timeout_s: float = 10.0) -> None:
    """SIGKILL every process in ``ns`` (again and again, so forks are caught too) until none is
    left; ``NetnsError`` naming the survivors after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while pids := netns_pids(ns):
        if time.monotonic() > deadline:
            raise NetnsError(
                f"processes in namespace {ns} still alive {timeout_s:.0f}s after SIGKILL: "
                + "; ".join(_describe_pid(p) for p in pids)
            )
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(POLL_S)


def _describe_pid(pid: int) -> str:
    """``PID (state) cmdline`` from /proc, for error messages."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        cmd = (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return f"{pid} (gone)"
    return f"{pid} ({state}) {cmd.strip()}"


def delete_namespaces(prefix: str, timeout_s: float = 10.0) -> None:
    """Kill the processes of, then delete, every namespace named ``<prefix>-*``."""
    for ns in namespaces():
        if ns.startswith(prefix + "-"):
            kill_netns_pids(ns, timeout_s)
            _ip("netns", "del", ns, check=False)


def _try_lock(path: Path) -> int | None:
    """An fd holding an exclusive ``flock`` on ``path`` (created if missing), or ``None`` if a
    live process holds it (or it was replaced while we locked it)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino == os.stat(path).st_ino:  # not unlinked by a reaper meanwhile
            return fd
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.ENOENT):
            os.close(fd)
            raise
    os.close(fd)
    return None


def reap_stale() -> None:
    """Delete the namespaces of every prefix in ``LOCK_DIR`` whose lock nobody holds (their
    ``Hosts`` died without ``close``), and its lock file."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    for path in LOCK_DIR.iterdir():
        fd = _try_lock(path)
        if fd is None:
            continue
        try:
            delete_namespaces(path.name)
            path.unlink()
        finally:
            os.close(fd)


def _claim_prefix() -> tuple[str, int]:
    """A prefix ``arl<pid>.<seq>`` no live ``Hosts`` holds, and the fd whose lock holds it."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    for seq in range(1000):
        prefix = f"arl{os.getpid()}.{seq}"
        fd = _try_lock(LOCK_DIR / prefix)
        if fd is not None:
            delete_namespaces(prefix)  # a dead owner's leftovers (its pid reused by us)
            return prefix, fd
    raise NetnsError(f"no free namespace prefix arl{os.getpid()}.<0..999> in {LOCK_DIR}")


def _subnet(prefix: str) -> str:
    """``10.<a>.<b>`` for ``arl<pid>.<seq>``: a in 100..199, b in 0..255."""
    pid, seq = (int(x) for x in prefix[3:].split("."))
    n = (pid * 8 + seq) % (100 * 256)
    return f"10.{100 + n // 256}.{n % 256}"


class Hosts:
    """Named hosts (network namespaces) on one bridge; see the module docstring.

    A context manager; ``close`` (also at exit of the interpreter) kills every process in every
    namespace and deletes the namespaces. Creating one needs root (see ``available``).
    """

    def __init__(self, names: Sequence[str], link_timeout_s: float = 10.0) -> None:
        self._check_names(names)
        self.names: list[str] = list(names)
        self.link_timeout_s = link_timeout_s
        self._procs: list[tuple[str, subprocess.Popen]] = []
        self._created: list[str] = []
        self._closed = False
        self._owner_pid = os.getpid()
        reap_stale()
        self.prefix, self._lock_fd = _claim_prefix()
        self.subnet = _subnet(self.prefix)
        atexit.register(self.close)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _check_names(names: Sequence[str]) -> None:
        """``ValueError`` unless the names are distinct, short, plain, not ``switch``, <= 254."""
        bad = [n for n in names if not _NAME.fullmatch(n) or n == SWITCH]
        if bad or len(set(names)) != len(names) or not 0 < len(names) <= MAX_HOSTS:
            raise ValueError(
                f"host names must be 1..{MAX_HOSTS} distinct names matching {_NAME.pattern}, "
                f"not {SWITCH!r}; got {list(names)!r}"
            )

    # -- building -------------------------------------------------------------------------------

    def _build(self) -> None:
        """The switch namespace with its bridge, then every host, then wait for the links."""
        sw = self._add_ns(self.switch_ns)
        _ip("-n", sw, "link", "add", BRIDGE, "type", "bridge")
        _ip("-n", sw, "link", "set", BRIDGE, "up")
        for k, name in enumerate(self.names):
            self._add_host(k, name)
        for name in self.names:
            self._wait_carrier(name, True)

    def _add_ns(self, ns: str) -> str:
        """Create namespace ``ns`` (remembered for ``close``) with ``lo`` up."""
        _ip("netns", "add", ns)
        self._created.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        return ns

    def _add_host(self, k: int, name: str) -> None:
        """Namespace of host ``k``: ``arl0`` at ``addr(name)``, its peer a port of the bridge."""
        ns, sw, port = self._add_ns(self.ns(name)), self.switch_ns, self._port(name)
        _ip("-n", sw, "link", "add", port, "type", "veth", "peer", "name", HOST_IF, "netns", ns)
        _ip("-n", sw, "link", "set", port, "master", BRIDGE, "up")
        _ip("-n", ns, "addr", "add", f"{self.addr(name)}/24", "dev", HOST_IF)
        _ip("-n", ns, "link", "set", HOST_IF, "up")

    # -- names ----------------------------------------------------------------------------------

    @property
    def switch_ns(self) -> str:
        """The namespace that holds the bridge."""
        return f"{self.prefix}-{SWITCH}"

    def _index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise KeyError(f"no host {name!r}; hosts are {self.names}") from None

    def ns(self, name: str) -> str:
        """The namespace of host ``name`` (for ``ip netns exec`` / ``ip -n``)."""
        self._index(name)
        return f"{self.prefix}-{name}"

    def addr(self, name: str) -> str:
        """Host ``name``'s IPv4 address (``10.a.b.k+1``, k its index in ``names``)."""
        return f"{self.subnet}.{self._index(name) + 1}"

    def _port(self, name: str) -> str:
        """Host ``name``'s bridge port in the switch namespace."""
        return f"arlp{self._index(name)}"

    # -- processes ------------------------------------------------------------------------------

    def cmd(self, name: str, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run in host ``name`` (e.g. for ``tests.roles.Roles.start``)."""
        return ["ip", "netns", "exec", self.ns(name), *argv]

    def popen(
        self, name: str, argv: Sequence[str], env: dict | None = None, **popen_kw
    ) -> subprocess.Popen:
        """Start ``argv`` in host ``name`` (its pid is the program's: ``ip`` execs it); ``env``
        is added to this process's environment; ``popen_kw`` go to ``subprocess.Popen``."""
        self._check_open()
        full_env = {**os.environ, **(env or {})}
        proc = subprocess.Popen(self.cmd(name, argv), env=full_env, **popen_kw)
        self._procs.append((name, proc))
        return proc

    def run(
        self,
        name: str,
        argv: Sequence[str],
        timeout: float = 30.0,
        env: dict | None = None,
        **run_kw,
    ) -> subprocess.CompletedProcess:
        """Run ``argv`` in host ``name`` to completion (killed and ``TimeoutExpired`` after
        ``timeout``); output captured as text unless ``run_kw`` says otherwise."""
        self._check_open()
        run_kw.setdefault("capture_output", True)
        run_kw.setdefault("text", True)
        full_env = {**os.environ, **(env or {})}
        return subprocess.run(self.cmd(name, argv), env=full_env, timeout=timeout, **run_kw)

    def pids(self, name: str) -> list[int]:
        """The processes running in host ``name`` (any parent, not only ours)."""
        return netns_pids(self.ns(name))

    def kill_all(self, name: str, timeout_s: float = 10.0) -> None:
        """SIGKILL every process in host ``name`` and wait until none is left and our own
        children there are reaped; ``NetnsError`` naming the survivors after ``timeout_s``."""
        kill_netns_pids(self.ns(name), timeout_s)
        self._reap(name, timeout_s)

    def _reap(self, name: str | None, timeout_s: float) -> None:
        """Wait for the (killed) ``popen`` children of host ``name`` (all hosts if ``None``)."""
        deadline = time.monotonic() + timeout_s
        for host, proc in self._procs:
            if name is None or host == name:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(max(0.0, deadline - time.monotonic()))
        self._procs = [(h, p) for h, p in self._procs if p.poll() is None]

    # -- partitions -----------------------------------------------------------------------------

    def partition(self, *names: str) -> None:
        """Cut hosts ``names`` off the network, both ways, established connections included
        (their bridge ports go down); returns once each host's link has lost its carrier."""
        for name in names:
            _ip("-n", self.switch_ns, "link", "set", self._port(name), "down")
        for name in names:
            self._wait_carrier(name, False)

    def heal(self, *names: str) -> None:
        """Undo ``partition``: the ports go up; returns once each host's link has its carrier."""
        for name in names:
            _ip("-n", self.switch_ns, "link", "set", self._port(name), "up")
        for name in names:
            self._wait_carrier(name, True)

    @contextlib.contextmanager
    def partitioned(self, *names: str) -> Iterator[None]:
        """``partition(*names)`` for the ``with`` block, ``heal`` after it (also on error)."""
        self.partition(*names)
        try:
            yield
        finally:
            self.heal(*names)

    def carrier(self, name: str) -> bool:
        """Whether host ``name``'s link is up with a carrier (not partitioned)."""
        out = _ip("-n", self.ns(name), "-o", "link", "show", HOST_IF).stdout
        return "LOWER_UP" in out.split(">", 1)[0]

    def _wait_carrier(self, name: str, up: bool) -> None:
        """Wait until ``carrier(name) == up``; ``NetnsError`` after ``link_timeout_s``."""
        deadline = time.monotonic() + self.link_timeout_s
        while self.carrier(name) != up:
            if time.monotonic() > deadline:
                raise NetnsError(
                    f"host {name!r}: link {HOST_IF} in {self.ns(name)} did not "
                    f"{'get' if up else 'lose'} its carrier within {self.link_timeout_s:.0f}s"
                )
            time.sleep(POLL_S)

    # -- closing --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise NetnsError(f"hosts {self.prefix} are closed")

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self, timeout_s: float = 10.0) -> None:
        """Kill every process in every namespace, delete the namespaces (hosts, then the switch)
        and release the prefix. Idempotent; raises ``NetnsError`` (after deleting all it could)
        if some processes would not die."""
        if self._closed or os.getpid() != self._owner_pid:  # a forked child owns nothing
            return
        self._closed = True
        atexit.unregister(self.close)
        errors = []
        for ns in reversed(self._created):
            try:
                kill_netns_pids(ns, timeout_s)
            except NetnsError as e:
                errors.append(str(e))
            _ip("netns", "del", ns, check=False)
        self._reap(None, timeout_s)
        self._release_prefix()
        if errors:
            raise NetnsError("closing hosts " + self.prefix + ":\n" + "\n".join(errors))

    def _release_prefix(self) -> None:
        """Remove our lock file and drop its lock."""
        with contextlib.suppress(FileNotFoundError):
            (LOCK_DIR / self.prefix).unlink()
        os.close(self._lock_fd)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        hosts = ", ".join(f"{n}={self.addr(n)}" for n in self.names)
        return f"<Hosts {self.prefix} {state}: {hosts}>"
