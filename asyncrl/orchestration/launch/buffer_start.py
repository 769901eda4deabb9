"""The job's buffer, started or joined by a launch: the configured ``buffer.url`` (checked
now), or a private ``redis-server`` in ``<run_dir>/redis`` (buffer/service/server.py) that
writes one URL file per user (admin, ``learner``, ``actor``) and, with ``buffer.tls_dir``,
serves TLS only. ``asyncrl launch buffer`` serves that server alone (``serve_buffer``).

The buffer package is imported inside the functions: ``asyncrl --help`` stays instant.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from asyncrl.core.config.job import Config
from asyncrl.core.config.load import ConfigError
from asyncrl.core.runtime import rundir
from asyncrl.core.runtime.lifeline import child_cmd
from asyncrl.orchestration.launch.stop_signals import begin_shutdown, hurried

if TYPE_CHECKING:
    from asyncrl.buffer.service.server import RedisServer
    from asyncrl.buffer.service.tls import TlsFiles


def start_buffer(cfg: Config, run_dir: Path) -> tuple[str, RedisServer | None]:
    """(url, server or None): the configured Redis, or a private one in ``run_dir/redis``."""

    if cfg.buffer.url:
        check_access(cfg.buffer.url, cfg.buffer.name)  # fail now, with the URL in the message
        return cfg.buffer.url, None
    server = redis_server(cfg, run_dir).start()
    server.watch(lambda text: print(text, flush=True))  # restart it from its AOF if it dies
    return server.url, server


def check_access(url: str, name: str) -> None:
    """Connect to ``url`` and read a key of buffer ``name``: a wrong password, host or key
    prefix (``launch buffer`` gives its ACL users the keys of its own ``buffer.name``) fails
    now with the fix, not as a traceback inside a role."""
    import redis

    from asyncrl.buffer.connection import BufferUnavailable, connect, mask_url

    client = connect(url)
    try:
        client.exists(f"{name}:meta")
    except redis.exceptions.NoPermissionError:
        raise ValueError(
            f"the Redis user of buffer.url ({mask_url(url)}) may not use the keys of "
            f"buffer.name={name!r}: `asyncrl launch buffer` grants its users the keys of its own "
            "buffer.name; give every role the same buffer.name"
        ) from None
    except redis.RedisError as e:
        raise BufferUnavailable(f"Redis at {mask_url(url)} failed: {e}") from None
    finally:
        client.close()


def role_url(url: str, server: RedisServer | None, role: str) -> str:
    """The URL a role gets: its least-privilege ACL user on our private Redis (``actor`` or
    ``learner``, see asyncrl.buffer.service.files.ROLE_USERS), else the configured ``buffer.url``."""
    return server.url_for(role) if server is not None else url


def redis_server(cfg: Config, run_dir: Path) -> RedisServer:
    """The private redis-server in ``run_dir/redis``, on ``buffer.port`` (0: a free one), with
    the ACL users' passwords of ``buffer.passwords_dir`` when it is set; it dies with this
    process and holds the run directory's lock while it lives."""
    from asyncrl.buffer.service.server import RedisOptions, RedisServer

    net = cfg.network
    options = RedisOptions(
        port=cfg.buffer.port,
        host=net.bind,
        advertise=net.advertise,
        tls=tls_files(cfg),
        user_passwords=given_passwords(cfg),
    )
    return RedisServer(
        run_dir / "redis",
        options,
        key_prefix=cfg.buffer.name,
        wrap=lambda cmd: child_cmd(cmd, hold_sigterm=True),  # stopped by us, after the roles
        pass_fds=rundir.held_fds(),
    )


def given_passwords(cfg: Config) -> dict[str, str]:
    """The ACL users' passwords from ``buffer.passwords_dir`` ({} when unset: generated)."""
    if not cfg.buffer.passwords_dir:
        return {}
    from asyncrl.buffer.service.files import read_passwords

    try:
        return read_passwords(cfg.buffer.passwords_dir)
    except ValueError as e:
        raise ConfigError(f"buffer.passwords_dir: {e}") from None


def tls_files(cfg: Config) -> TlsFiles | None:
    """``buffer.tls_dir``'s files (made when missing) for the advertised address, or None."""
    if not cfg.buffer.tls_dir:
        return None
    from asyncrl.buffer.service.tls import TlsError, ensure

    ips = list(dict.fromkeys([cfg.network.address, "127.0.0.1"]))  # + loopback: local tools
    try:
        return ensure(cfg.buffer.tls_dir, ips, say=lambda t: print(f"[buffer] {t}", flush=True))
    except TlsError as e:
        raise ConfigError(f"buffer.tls_dir: {e}") from None


def serve_buffer(cfg: Config, run_dir: Path) -> int:
    """``asyncrl launch buffer``: start the private redis-server, say where each role's URL
    file is, and keep it until Ctrl-C/SIGTERM (0) or until it exits (1)."""
    server = redis_server(cfg, run_dir).start()
    url_file = server.run_dir / "redis.url"
    print(
        f"[buffer] redis-server ready; its URL (with password) is in {url_file} (mode 0600)",
        flush=True,
    )
    print(
        f"[buffer] give each role its least-privilege ACL user's URL file (copy it to the "
        f"role's hosts, mode 0600): learner buffer.url_file={server.run_dir / 'redis.learner.url'}"
        f", actors buffer.url_file={server.run_dir / 'redis.actor.url'}",
        flush=True,
    )
    if server.tls is not None:
        print(
            f"[buffer] TLS only (no plain port); the URLs verify the server with "
            f"{server.tls.ca}: that file must be at the same path on every role's host",
            flush=True,
        )
    try:
        while server.running():
            time.sleep(1.0)
        print("[buffer] redis-server exited", flush=True)
        return 1
    except KeyboardInterrupt:
        serve_until_released(server.url, cfg.buffer.name, cfg.buffer.stop_grace_s)
        return 0
    finally:
        begin_shutdown()
        server.stop()


def serve_until_released(url: str, name: str, grace_s: float, poll_s: float = 0.5) -> None:
    """Asked to stop: keep serving while the job's learner or actors hold buffer ``name``
    (buffer/service/holders.py), at most ``grace_s`` (``buffer.stop_grace_s``) or until a second
    Ctrl-C/SIGTERM, saying what it waits for and what was still held when it gave up."""
    from asyncrl.buffer.connection import connect
    from asyncrl.buffer.service.holders import holders

    if grace_s <= 0:
        return
    client = connect(url)
    deadline = time.monotonic() + grace_s
    try:
        held = holders(client, name)
        if held:
            print(f"[buffer] stop requested; serving until {' and '.join(held)} let go "
                  f"(at most {grace_s:g}s, buffer.stop_grace_s; Ctrl-C again stops now)",
                  flush=True)  # fmt: skip
        while held and time.monotonic() < deadline and not hurried():
            time.sleep(poll_s)
            held = holders(client, name)
    except Exception as e:  # the server died meanwhile: nothing left to serve
        print(f"[buffer] could not read who holds the buffer ({e}); stopping", flush=True)
        return
    finally:
        client.close()
    if held:
        print(f"[buffer] stopping while {' and '.join(held)} still hold(s) it", flush=True)
