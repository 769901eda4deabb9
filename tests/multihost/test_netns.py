"""Self-tests of tests/multihost/netns.py: hosts reach each other over TCP, loopback stays
private, partitions cut (and heal) both directions and established connections, ``kill_all``
and ``close`` leave nothing behind, a crashed owner's namespaces are reaped."""

from __future__ import annotations

import errno
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.multihost.netns import LOCK_DIR, Hosts, NetnsError, _ip, namespaces
from tests.roles import REPO

pytestmark = pytest.mark.timeout(60)

PY = sys.executable
PORT = 7000  # every host has its own port space
LINE_TIMEOUT_S = 15.0

ECHO_SERVER = """
import socket, sys, threading
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
def echo(conn):
    with conn:
        while data := conn.recv(1024):
            conn.sendall(data)
while True:
    threading.Thread(target=echo, args=(srv.accept()[0],), daemon=True).start()
"""

CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as s:
        s.sendall(b"ping")
        print("ok" if s.recv(4) == b"ping" else "bad echo")
except OSError as e:
    print(f"{type(e).__name__}:{e.errno}")
"""

# One connection kept open; stdin lines: "send WORD" or "recv TIMEOUT_S"; one line out for each.
SESSION = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
print("connected", flush=True)
for line in sys.stdin:
    cmd, arg = line.split()
    if cmd == "send":
        s.sendall(arg.encode())
        print("sent", flush=True)
    else:
        s.settimeout(float(arg))
        try:
            print("got " + s.recv(1024).decode(), flush=True)
        except TimeoutError:
            print("timeout", flush=True)
"""

CUT_OFF = {f"TimeoutError:{None}", f"OSError:{errno.EHOSTUNREACH}", f"OSError:{errno.ENETUNREACH}"}
"""What a connect across a partition may end with (a refusal would mean a packet got through)."""


class Lines:
    """The stdout lines of a process, read by a thread so that every wait has a deadline."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.q: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.q.put(line.rstrip("\n"))

    def next(self, timeout_s: float = LINE_TIMEOUT_S) -> str:
        """The next line; fails after ``timeout_s`` saying whether the process still runs."""
        try:
            return self.q.get(timeout=timeout_s)
        except queue.Empty:
            code = self.proc.poll()
            state = "still running" if code is None else f"exited with {code}"
            raise AssertionError(
                f"no line from {self.proc.args} in {timeout_s}s ({state})"
            ) from None


def start_server(hosts: Hosts, name: str, bind: str | None = None, port: int = PORT) -> None:
    """An echo server in host ``name`` on ``bind`` (default: its address); returns once ready."""
    proc = hosts.popen(
        name,
        [PY, "-c", ECHO_SERVER, bind or hosts.addr(name), str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert Lines(proc).next() == "ready"


def connect(hosts: Hosts, *tries: tuple[str, str], timeout_s: float = 2.0, port: int = PORT):
    """Run one ``CLIENT`` per ``(from_host, to_addr)`` at once; their results, in order."""
    argv = [PY, "-c", CLIENT, "", str(port), str(timeout_s)]
    procs = []
    for src, dst in tries:
        argv[3] = dst
        procs.append(hosts.popen(src, list(argv), stdout=subprocess.PIPE, text=True))
    return [p.communicate(timeout=timeout_s + LINE_TIMEOUT_S)[0].strip() for p in procs]


def test_hosts_reach_each_other_over_tcp(hosts_factory):
    hosts = hosts_factory(["a", "b", "c"])
    addrs = [hosts.addr(n) for n in hosts.names]
    assert addrs == [f"{hosts.subnet}.{k}" for k in (1, 2, 3)]
    for name in hosts.names:
        start_server(hosts, name)
    tries = [(src, hosts.addr(dst)) for src in "abc" for dst in "abc" if src != dst]
    assert connect(hosts, *tries) == ["ok"] * len(tries)


def test_root_namespace_untouched(hosts_factory):
    hosts = hosts_factory(["a", "b"])
    root_links = re.findall(r"^\d+: ([^:@]+)", _ip("-o", "link", "show").stdout, re.M)
    assert not [name for name in root_links if name.startswith("arl")], root_links
    root_addrs = _ip("-o", "addr", "show").stdout
    assert f" {hosts.subnet}." not in root_addrs, root_addrs
    host_addrs = _ip("-n", hosts.ns("a"), "-o", "addr", "show").stdout
    assert f" {hosts.addr('a')}/24 " in host_addrs and " 127.0.0.1/8 " in host_addrs, host_addrs


def test_loopback_is_private(hosts_factory):
    hosts = hosts_factory(["a", "b"])
    start_server(hosts, "a", bind="127.0.0.1")
    refused = f"ConnectionRefusedError:{errno.ECONNREFUSED}"
    assert connect(hosts, ("a", "127.0.0.1"), ("b", hosts.addr("a")), ("b", "127.0.0.1")) == [
        "ok",
        refused,
        refused,
    ]


def test_partition_cuts_both_ways_and_heals(hosts_factory):
    hosts = hosts_factory(["a", "b", "c"])
    for name in ("a", "b"):
        start_server(hosts, name)
    session = hosts.popen(
        "b",
        [PY, "-c", SESSION, hosts.addr("a"), str(PORT)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    lines = Lines(session)

    def say(line: str, timeout_s: float = LINE_TIMEOUT_S) -> str:
        session.stdin.write(line + "\n")
        session.stdin.flush()
        return lines.next(timeout_s)

    assert lines.next() == "connected"
    assert (say("send one"), say("recv 5")) == ("sent", "got one")

    with hosts.partitioned("a"):
        assert not hosts.carrier("a") and hosts.carrier("b")
        assert say("send two") == "sent"  # into the socket buffer; it must not get across
        session.stdin.write("recv 1.5\n")
        session.stdin.flush()
        ab, ba, cb = connect(
            hosts,
            ("a", hosts.addr("b")),
            ("b", hosts.addr("a")),
            ("c", hosts.addr("b")),
            timeout_s=1.5,
        )
        assert ab in CUT_OFF and ba in CUT_OFF and cb == "ok", (ab, ba, cb)
        assert lines.next() == "timeout"  # the established connection stalls too

    assert hosts.carrier("a")
    assert say("recv 10") == "got two"  # retransmitted once healed
    assert connect(hosts, ("a", hosts.addr("b")), ("b", hosts.addr("a"))) == ["ok", "ok"]


def test_kill_all_leaves_no_process(hosts_factory):
    hosts = hosts_factory(["a", "b"])
    ignores_term = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
    )
    procs = [
        hosts.popen("a", ["sleep", "300"]),
        hosts.popen("a", ["sh", "-c", "sleep 300 & sleep 300 & wait"]),
        hosts.popen("a", ["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 < /dev/null &"]),
        hosts.popen("a", [PY, "-c", ignores_term]),
    ]
    other = hosts.popen("b", ["sleep", "300"])
    deadline = time.monotonic() + 10
    while len(hosts.pids("a")) < 6:  # 4 started + 2 background sleeps (the setsid one: + 1)
        assert time.monotonic() < deadline, f"processes did not start: {hosts.pids('a')}"
        time.sleep(0.05)
    before = hosts.pids("a")

    hosts.kill_all("a")

    assert hosts.pids("a") == []
    assert all(p.poll() == -signal.SIGKILL for p in procs[:2] + procs[3:])
    assert not [pid for pid in before if os.path.exists(f"/proc/{pid}/ns/net")]
    assert other.poll() is None and hosts.pids("b") == [other.pid]


def test_close_removes_everything_and_is_idempotent(hosts_factory):
    hosts = hosts_factory(["a", "b"])
    proc = hosts.popen("a", ["sleep", "300"])
    ours = [hosts.ns("a"), hosts.ns("b"), hosts.switch_ns]
    assert set(ours) <= set(namespaces())
    assert (LOCK_DIR / hosts.prefix).exists()

    hosts.close()

    assert not set(ours) & set(namespaces())
    assert proc.poll() == -signal.SIGKILL
    assert not (LOCK_DIR / hosts.prefix).exists()
    hosts.close()  # again: nothing to do
    with pytest.raises(NetnsError, match="closed"):
        hosts.popen("a", ["true"])


def test_crashed_owner_is_reaped(hosts_factory):
    owner = (
        "import subprocess, sys\n"
        "from tests.multihost.netns import Hosts\n"
        "h = Hosts(['x', 'y'])\n"
        "h.popen('x', ['sleep', '300'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(h.prefix, flush=True)\n"
        "sys.stdin.read()\n"  # alive (holding its prefix) until SIGKILLed: no close, no atexit
    )
    proc = subprocess.Popen(
        [PY, "-c", owner], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        prefix = Lines(proc).next()
        ours = {f"{prefix}-{n}" for n in ("x", "y", "switch")}
        assert ours <= set(namespaces())
        hosts_factory(["z"])  # a live owner's namespaces are left alone
        assert ours <= set(namespaces())
    finally:
        proc.kill()
        proc.communicate(timeout=LINE_TIMEOUT_S)

    hosts_factory(["z"])  # a dead owner's are deleted, its processes killed

    assert not ours & set(namespaces())
    assert not (LOCK_DIR / prefix).exists()


def test_bad_names(hosts_factory):
    for names in ([], ["a", "a"], ["switch"], ["-a"], ["a b"]):
        with pytest.raises(ValueError):
            hosts_factory(names)
    hosts = hosts_factory(["a"])
    with pytest.raises(KeyError, match="no host 'b'"):
        hosts.addr("b")
