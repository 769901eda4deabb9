"""A private ``redis-server`` for one run: loopback (or ``host``) or unix socket, password, ACL
users, AOF, no eviction.

Files in ``run_dir``::

    redis.conf      the server config (mode 0600: it holds the password)
    redis.url       the admin URL (mode 0600), e.g. redis://:PASSWORD@127.0.0.1:PORT/0
    redis.actor.url, redis.learner.url   the roles' least-privilege ACL users' URLs (0600)
    redis.log       the server's log (stdout/stderr), quoted in startup errors
    appendonlydir/  the AOF (``appendonly yes``): the buffer survives a server restart
    redis.sock      the unix socket, when ``unix_socket=True``

Restarting in the same ``run_dir`` reuses the previous password and, when ``port=0`` and it
is still free, the previous port, so the URL other processes hold stays valid.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from asyncrl.buffer.connection import BufferUnavailable, call_with_retries, connect, mask_url
from asyncrl.buffer.service.files import (
    ROLE_USERS,
    acl_lines,
    aof_hint,
    port_lines,
    read_previous_conf,
)
from asyncrl.buffer.service.tls import TlsFiles
from asyncrl.core.runtime.rundir import write_atomic

__all__ = [
    "ROLE_USERS",
    "RedisOptions",
    "RedisServer",
    "RedisServerError",
    "BufferUnavailable",
    "connect",
    "call_with_retries",
]

log = logging.getLogger(__name__)

_MISSING = (
    "redis-server not found on PATH; install it: apt-get install -y redis-server, or set buffer.url"
)
_SUN_PATH_MAX = 107  # sockaddr_un.sun_path is 108 bytes including the trailing NUL


class RedisServerError(RuntimeError):
    """The private redis-server is missing or did not start; the message quotes its log."""


@dataclass(frozen=True)
class RedisOptions:
    """How a private ``redis-server`` listens, stores and starts (``RedisServer(options=)``);
    the defaults are a loopback TCP server with a generated password and an fsync per write.
    Bad values raise ``ValueError`` here, before anything starts."""

    port: int = 0
    """TCP port in [0, 65535]; 0 picks a free one (a restart reuses the previous if free)."""
    unix_socket: bool = False
    """Listen on ``run_dir/redis.sock`` only (no TCP; not with ``tls``)."""
    host: str = "127.0.0.1"
    """The address the server binds (``network.bind``)."""
    advertise: str = ""
    """The host its URLs name, where clients on other hosts connect ('' = ``host``)."""
    tls: TlsFiles | None = None
    """Serve TLS only (no plain port); the URLs are ``rediss://`` and carry the CA path
    clients verify the server with (buffer/service/tls.py)."""
    password: str | None = field(default=None, repr=False)  # a secret: not in a repr
    """The admin (``default`` user) password; None = the previous one in ``run_dir``, else a
    new ``secrets.token_urlsafe``."""
    user_passwords: dict[str, str] = field(default_factory=dict, repr=False)  # secrets
    """The ACL users' passwords by user (``ROLE_USERS``; ``files.read_passwords`` reads them
    from ``buffer.passwords_dir``); a user not given keeps the previous one in ``run_dir``,
    else gets a new ``secrets.token_urlsafe``."""
    maxmemory: str | None = None
    """Memory bound, e.g. ``"2gb"``; writes are refused (never keys evicted) beyond it."""
    appendfsync: str = "always"
    """The AOF's fsync policy: ``always`` (no acknowledged write lost) or ``everysec``."""
    executable: str = "redis-server"
    """The server binary, looked up on PATH."""
    start_timeout_s: float = 10.0
    """How long ``start()`` waits for the server to answer PING (> 0)."""

    def __post_init__(self) -> None:
        if self.tls is not None and self.unix_socket:
            raise ValueError("TLS is for TCP; a unix socket is local (give one or the other)")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.start_timeout_s <= 0:
            raise ValueError(f"start_timeout_s must be > 0, got {self.start_timeout_s}")
        if unknown := sorted(set(self.user_passwords) - set(ROLE_USERS)):
            raise ValueError(
                f"user_passwords: unknown users {unknown}; the users: {list(ROLE_USERS)}"
            )
        if self.appendfsync not in ("always", "everysec"):
            raise ValueError(
                f"appendfsync must be 'always' or 'everysec', got {self.appendfsync!r}"
            )


class RedisServer:
    """Owns one ``redis-server`` child process. Use as a context manager or start()/stop().

    ``options`` (``RedisOptions``) says where it listens: ``port=0`` picks a free port;
    ``unix_socket=True`` listens on ``run_dir/redis.sock`` only (no TCP). The server binds
    ``host`` only (127.0.0.1 by default; ``network.bind``), and its URLs name ``advertise``
    (default ``host``): where clients on other hosts connect. It requires a password
    (``secrets.token_urlsafe``) for every user, appends every write to the AOF, and refuses
    writes rather than evicting keys when ``maxmemory`` (e.g. ``"2gb"``) is reached.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        options: RedisOptions | None = None,
        *,
        key_prefix: str | None = None,
        wrap: Callable[[list[str]], list[str]] | None = None,
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        """``key_prefix``: the buffer name whose keys the role ACL users may use
        (buffer/service/files.py). ``wrap(cmd)`` returns the command line that runs ``cmd``
        (the launcher's makes the server die with it: asyncrl/core/runtime/lifeline.py);
        ``pass_fds`` are inherited by the server."""
        self.options = o = options or RedisOptions()
        self.run_dir = Path(run_dir).resolve()
        self.host, self.advertise = o.host, o.advertise or o.host
        self.unix_socket, self.tls = o.unix_socket, o.tls
        self.key_prefix = key_prefix
        self._wrap = wrap or (lambda cmd: cmd)
        self._pass_fds = pass_fds
        self._previous = read_previous_conf(self.conf_path)
        self.password = o.password or self._previous.get("requirepass") or secrets.token_urlsafe(24)
        self.user_passwords = {
            user: o.user_passwords.get(user)
            or self._previous.get(f"user:{user}")
            or secrets.token_urlsafe(24)
            for user in ROLE_USERS
        }
        self.port: int | None = None
        self._log_offset = 0
        self.restarts = 0
        self.failure: Exception | None = None
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None
        self._proc: subprocess.Popen | None = None

    # -- paths and URL -------------------------------------------------------------------------

    @property
    def conf_path(self) -> Path:
        return self.run_dir / "redis.conf"

    @property
    def log_path(self) -> Path:
        return self.run_dir / "redis.log"

    @property
    def socket_path(self) -> Path:
        return self.run_dir / "redis.sock"

    @property
    def url(self) -> str:
        """The client URL (contains the password; log ``mask_url(url)`` instead)."""
        if self.unix_socket:
            return f"unix://:{self.password}@{self.socket_path}?db=0"
        if self.port is None:
            raise RuntimeError("RedisServer.url is known only after start()")
        return self._tcp_url(f":{self.password}", self.advertise)

    def _tcp_url(self, auth: str, host: str, check_hostname: bool = True) -> str:
        if self.tls is None:
            return f"redis://{auth}@{host}:{self.port}/0"
        query = self.tls.client_query()
        if not check_hostname:  # our own child on the bound address: the CA is still checked
            query = query.replace("ssl_check_hostname=true", "ssl_check_hostname=false")
        return f"rediss://{auth}@{host}:{self.port}/0?{query}"

    @property
    def _local_url(self) -> str:
        """The admin URL from this host (startup checks, SHUTDOWN): the bound address."""
        if self.unix_socket:
            return self.url
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return self._tcp_url(f":{self.password}", host, check_hostname=False)

    def url_for(self, user: str) -> str:
        """The URL of the least-privilege ACL user ``user`` ("actor" or "learner").

        ``url`` (the ``default`` user) is the admin URL: launcher, ``asyncrl status``, tests.
        """
        if user not in ROLE_USERS:
            raise ValueError(f"unknown Redis user {user!r}; one of {sorted(ROLE_USERS)}")
        pw = self.user_passwords[user]
        if self.unix_socket:
            return f"unix://{user}:{pw}@{self.socket_path}?db=0"
        if self.port is None:
            raise RuntimeError("RedisServer.url_for is known only after start()")
        return self._tcp_url(f"{user}:{pw}", self.advertise)

    @property
    def pid(self) -> int | None:
        """The redis-server process id while started (for fault-injection tests)."""
        return self._proc.pid if self._proc is not None else None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> RedisServer:
        """Start the server and wait (up to ``start_timeout_s``) until it answers PING.

        After the process died (crash, SIGKILL) ``start()`` restarts it in the same run
        directory: same password, same port if still free, the data replayed from the AOF.
        Raises ``RedisServerError`` if the AOF is damaged (never starts empty instead).
        """
        if self._proc is not None:
            if self._proc.poll() is None:
                raise RuntimeError("RedisServer already started")
            self._proc = None  # it died: restart from the same directory
        exe = shutil.which(self.options.executable)
        if exe is None:
            raise RedisServerError(_MISSING)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.unix_socket and len(str(self.socket_path)) > _SUN_PATH_MAX:
            raise RedisServerError(
                f"unix socket path {self.socket_path} is longer than {_SUN_PATH_MAX} bytes; "
                "use a shorter run directory or TCP (unix_socket=False)"
            )
        self._previous = read_previous_conf(self.conf_path)  # a restart reuses the last port
        # An auto-picked port can be taken between our probe and redis binding it: retry.
        for attempt in range(3):
            self.port = None if self.unix_socket else self._choose_port()
            write_atomic(self.conf_path, self._config_text())
            self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            with open(self.log_path, "ab") as log:
                cmd = self._wrap([exe, str(self.conf_path)])
                # a session of its own: a signal to the launcher's whole process group (a
                # terminal's Ctrl-C, `timeout`, a batch scheduler) must not stop Redis before
                # the launcher has stopped the roles; it still dies with the
                # launcher (``wrap``: asyncrl/core/runtime/lifeline.py) and is stopped by ``stop()``
                self._proc = subprocess.Popen(
                    cmd, stdout=log, stderr=log, pass_fds=self._pass_fds, start_new_session=True
                )
            try:
                self._wait_ready()
                break
            except RedisServerError:
                self._proc = None
                in_use = "Address already in use" in self._log_tail()
                if not (in_use and self.options.port == 0 and attempt < 2):
                    raise
        write_atomic(self.run_dir / "redis.url", self.url + "\n")
        for user in ROLE_USERS:
            write_atomic(self.run_dir / f"redis.{user}.url", self.url_for(user) + "\n")
        self._retire_torn_aof()
        return self

    def watch(self, report=print, poll_s: float = 0.2) -> None:
        """Restart the server from its directory whenever it dies (crash, OOM kill, SIGKILL),
        in a daemon thread, until ``stop()``. ``report(text)`` is told of each restart and of
        a failed one (e.g. a damaged AOF: ``failure`` is then set and watching ends; clients
        get ``BufferUnavailable`` once their reconnect budget is spent). ``restarts`` counts.
        """
        if self._watcher is not None:
            return
        self._stopping.clear()

        def loop() -> None:
            while not self._stopping.wait(poll_s):
                with self._lock:
                    proc = self._proc
                    if self._stopping.is_set() or proc is None or proc.poll() is None:
                        continue
                    code = proc.returncode
                    try:
                        self.start()
                    except (RedisServerError, OSError) as e:
                        self.failure = e
                        report(f"[buffer] redis-server exited ({code}) and did not restart: {e}")
                        return
                    self.restarts += 1
                    report(
                        f"[buffer] redis-server exited ({code}); restarted from {self.run_dir} "
                        f"on the same port (restart {self.restarts})"
                    )

        self._watcher = threading.Thread(target=loop, name="redis-watch", daemon=True)
        self._watcher.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """SHUTDOWN (flushes the AOF), then terminate/kill if it has not exited in time."""
        self._stopping.set()
        with self._lock:
            self._stop(timeout_s)
        if self._watcher is not None:
            self._watcher.join(timeout=timeout_s)
            self._watcher = None

    def _stop(self, timeout_s: float) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            client = redis.Redis.from_url(self._local_url, socket_timeout=timeout_s)
            client.shutdown()
        except redis.RedisError:
            # SIGINT makes redis flush the AOF and exit cleanly, as SIGTERM does; a server
            # started through the lifeline's --hold-sigterm has SIGTERM blocked
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)

    def running(self) -> bool:
        """True while the child process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- helpers -------------------------------------------------------------------------------

    def _config_text(self) -> str:
        lines = [
            "# Written by asyncrl buffer/service/server.py. Holds the password: keep it mode 0600.",
            f"bind {self.host}",
            "protected-mode yes",
            *port_lines(self.port, self.tls),
            f"requirepass {self.password}",
            "appendonly yes",
            f"appendfsync {self.options.appendfsync}",
            # A torn last command (crash mid-write) was never acknowledged: drop it and start.
            # Damage anywhere else stops startup (see _wait_ready).
            "aof-load-truncated yes",
            "maxmemory-policy noeviction",
            f'dir "{self.run_dir}"',
            'logfile ""',  # stdout, which start() sends to redis.log
            'save ""',  # the AOF is the persistence; RDB snapshots would only add fork pauses
            "daemonize no",
        ]
        if self.unix_socket:
            lines += [f'unixsocket "{self.socket_path}"', "unixsocketperm 700"]
        if self.options.maxmemory:
            lines.append(f"maxmemory {self.options.maxmemory}")
        lines += acl_lines(self.key_prefix, self.user_passwords)
        return "\n".join(lines) + "\n"

    def _choose_port(self) -> int:
        if self.options.port:
            return self.options.port
        previous = int(self._previous.get("port", "0"))
        if previous and _port_free(previous, self.host):
            return previous
        with socket.socket(_family(self.host), socket.SOCK_STREAM) as s:
            s.bind((self.host, 0))
            return s.getsockname()[1]

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.options.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = self._log_tail()
                hint = aof_hint(self._log_since_start(), self.run_dir)
                raise RedisServerError(
                    f"redis-server exited with code {self._proc.returncode} during startup "
                    f"(config {self.conf_path}).{hint} Last lines of {self.log_path}:\n{tail}"
                )
            try:
                redis.Redis.from_url(self._local_url, socket_timeout=1.0).ping()
                return
            except redis.BusyLoadingError:
                pass  # still replaying a large AOF: keep waiting until the deadline
            except (redis.ConnectionError, redis.TimeoutError):
                pass
            time.sleep(0.02)
        self._proc.terminate()
        self._proc.wait(timeout=10)
        raise RedisServerError(
            f"redis-server did not answer PING at {mask_url(self.url)} within "
            f"{self.options.start_timeout_s}s. Last lines of {self.log_path}:\n{self._log_tail()}"
        )

    def _log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log written)"
        return "\n".join(text.splitlines()[-lines:])

    def _log_since_start(self) -> str:
        """What redis-server logged since the last ``start()`` ("" if unreadable)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _retire_torn_aof(self, timeout_s: float = 120.0) -> None:
        """After a start that dropped a torn AOF tail (``aof-load-truncated``), rewrite the AOF
        (BGREWRITEAOF) and wait for it, with a warning naming the log.

        Why: redis-server 7.0 truncates a tail torn inside a MULTI/EXEC (a Lua script's
        effects) at the last whole command, so the file keeps a MULTI without EXEC. The
        commands after it are not applied on this load, but the next load runs them with the
        next EXEC: a ``committed`` counter one higher than the stream, found by
        ``tests/faults/test_redis_restarts.py`` and shown in
        ``tests/integration/test_buffer_redis.py::test_an_aof_torn_inside_a_script_loads_the_same_twice``.
        The rewrite writes what this server holds into a new base file and retires the torn
        one; writes during it go to a new file already. Not covered: a second crash before
        the rewrite ends (it takes well under a second for a buffer of MBs).
        """
        text = self._log_since_start()
        if "loaded anyway because aof-load-truncated is enabled" not in text:
            return
        log.warning(
            "redis-server in %s dropped a torn last command of its AOF (a crash during a "
            "write; that command was never acknowledged); rewriting the AOF so the torn "
            "file is retired. See %s.",
            self.run_dir,
            self.log_path,
        )
        client = redis.Redis.from_url(self._local_url, socket_timeout=10.0)
        client.bgrewriteaof()
        deadline = time.monotonic() + timeout_s
        while True:
            info = client.info("persistence")
            if not (info["aof_rewrite_in_progress"] or info["aof_rewrite_scheduled"]):
                break
            if time.monotonic() > deadline:
                raise RedisServerError(
                    f"rewriting the AOF in {self.run_dir} after a torn tail took over "
                    f"{timeout_s:.0f}s; see {self.log_path}"
                )
            time.sleep(0.05)
        if info["aof_last_bgrewrite_status"] != "ok":
            raise RedisServerError(
                f"rewriting the AOF in {self.run_dir} after a torn tail failed "
                f"({info['aof_last_bgrewrite_status']}); see {self.log_path}"
            )


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        # Like redis itself, ignore TIME_WAIT leftovers of the previous server on this port.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
