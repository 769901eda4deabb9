"""A private ``redis-server`` for one run: loopback or unix socket, password, AOF, no eviction.

Files in ``run_dir``::

    redis.conf      the server config (mode 0600: it holds the password)
    redis.url       the URL clients use (mode 0600), e.g. redis://:PASSWORD@127.0.0.1:PORT/0
    redis.log       the server's log (stdout/stderr), quoted in startup errors
    appendonlydir/  the AOF (``appendonly yes``): the buffer survives a server restart
    redis.sock      the unix socket, when ``unix_socket=True``

Restarting in the same ``run_dir`` reuses the previous password and, when ``port=0`` and it
is still free, the previous port, so the URL other processes hold stays valid.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

from buffer.connection import BufferUnavailable, call_with_retries, connect, mask_url

__all__ = ["RedisServer", "RedisServerError", "BufferUnavailable", "connect", "call_with_retries"]

_MISSING = (
    "redis-server not found on PATH; install it: apt-get install -y redis-server, or set buffer.url"
)
_SUN_PATH_MAX = 107  # sockaddr_un.sun_path is 108 bytes including the trailing NUL


class RedisServerError(RuntimeError):
    """The private redis-server is missing or did not start; the message quotes its log."""


class RedisServer:
    """Owns one ``redis-server`` child process. Use as a context manager or start()/stop().

    ``port=0`` picks a free loopback port; ``unix_socket=True`` listens on
    ``run_dir/redis.sock`` only (no TCP). The server binds 127.0.0.1 only, requires a password
    (``secrets.token_urlsafe``), appends every write to the AOF, and refuses writes rather
    than evicting keys when ``maxmemory`` (e.g. ``"2gb"``) is reached.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        port: int = 0,
        unix_socket: bool = False,
        password: str | None = None,
        executable: str = "redis-server",
        start_timeout_s: float = 10.0,
        maxmemory: str | None = None,
    ) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {port}")
        if start_timeout_s <= 0:
            raise ValueError(f"start_timeout_s must be > 0, got {start_timeout_s}")
        self.run_dir = Path(run_dir).resolve()
        self.unix_socket = unix_socket
        self.executable = executable
        self.start_timeout_s = start_timeout_s
        self.maxmemory = maxmemory
        self._requested_port = port
        self._previous = self._read_previous_conf()
        self.password = password or self._previous.get("requirepass") or secrets.token_urlsafe(24)
        self.port: int | None = None
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
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> RedisServer:
        """Start the server and wait (up to ``start_timeout_s``) until it answers PING."""
        if self._proc is not None:
            raise RuntimeError("RedisServer already started")
        exe = shutil.which(self.executable)
        if exe is None:
            raise RedisServerError(_MISSING)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.unix_socket and len(str(self.socket_path)) > _SUN_PATH_MAX:
            raise RedisServerError(
                f"unix socket path {self.socket_path} is longer than {_SUN_PATH_MAX} bytes; "
                "use a shorter run directory or TCP (unix_socket=False)"
            )
        # An auto-picked port can be taken between our probe and redis binding it: retry.
        for attempt in range(3):
            self.port = None if self.unix_socket else self._choose_port()
            self._write_private(self.conf_path, self._config_text())
            with open(self.log_path, "ab") as log:
                self._proc = subprocess.Popen([exe, str(self.conf_path)], stdout=log, stderr=log)
            try:
                self._wait_ready()
                break
            except RedisServerError:
                self._proc = None
                in_use = "Address already in use" in self._log_tail()
                if not (in_use and self._requested_port == 0 and attempt < 2):
                    raise
        self._write_private(self.run_dir / "redis.url", self.url + "\n")
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """SHUTDOWN (flushes the AOF), then terminate/kill if it has not exited in time."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            client = redis.Redis.from_url(self.url, socket_timeout=timeout_s)
            client.shutdown()
        except redis.RedisError:
            proc.terminate()  # SIGTERM also makes redis flush the AOF and exit cleanly
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
            "# Written by asyncrl buffer/server.py. Holds the password: keep it mode 0600.",
            "bind 127.0.0.1",
            "protected-mode yes",
            f"port {self.port or 0}",
            f"requirepass {self.password}",
            "appendonly yes",
            "appendfsync everysec",
            "maxmemory-policy noeviction",
            f'dir "{self.run_dir}"',
            'logfile ""',  # stdout, which start() sends to redis.log
            'save ""',  # the AOF is the persistence; RDB snapshots would only add fork pauses
            "daemonize no",
        ]
        if self.unix_socket:
            lines += [f'unixsocket "{self.socket_path}"', "unixsocketperm 700"]
        if self.maxmemory:
            lines.append(f"maxmemory {self.maxmemory}")
        return "\n".join(lines) + "\n"

    def _choose_port(self) -> int:
        if self._requested_port:
            return self._requested_port
        previous = int(self._previous.get("port", "0"))
        if previous and _port_free(previous):
            return previous
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = self._log_tail()
                hint = ""
                if "append only file" in tail:
                    hint = (
                        f" The AOF in {self.run_dir / 'appendonlydir'} is damaged: back it up, then "
                        "run `redis-check-aof --fix <manifest>` or use a fresh run directory."
                    )
                raise RedisServerError(
                    f"redis-server exited with code {self._proc.returncode} during startup "
                    f"(config {self.conf_path}).{hint} Last lines of {self.log_path}:\n{tail}"
                )
            try:
                redis.Redis.from_url(self.url, socket_timeout=1.0).ping()
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
            f"{self.start_timeout_s}s. Last lines of {self.log_path}:\n{self._log_tail()}"
        )

    def _log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log written)"
        return "\n".join(text.splitlines()[-lines:])

    def _read_previous_conf(self) -> dict[str, str]:
        try:
            text = self.conf_path.read_text()
        except OSError:
            return {}
        out = {}
        for key in ("requirepass", "port"):
            m = re.search(rf"^{key} (\S+)$", text, re.MULTILINE)
            if m:
                out[key] = m.group(1)
        return out

    @staticmethod
    def _write_private(path: Path, text: str) -> None:
        """Write ``text`` so that the file is never readable by others, even briefly."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # O_CREAT's mode does not apply to an existing file
        with os.fdopen(fd, "w") as f:
            f.write(text)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # Like redis itself, ignore TIME_WAIT leftovers of the previous server on this port.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
