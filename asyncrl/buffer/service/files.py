"""What ``RedisServer`` (buffer/service/server.py) writes into and reads from its run directory's files,
as pure functions: the ACL users of the config file (``ROLE_USERS``), its listening lines,
the settings a restart takes over from the previous ``redis.conf`` (password, port, the ACL
users' passwords), the ACL users' passwords given as files (``read_passwords``), and the hint
that names a damaged AOF and its fix in a startup error.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from asyncrl.buffer.service.tls import TlsFiles

_COMMON = "+ping +hello +auth +select +client|setname +client|id +time"
_NO_ADMIN = "-@admin -@dangerous -flushdb -flushall"
_SCRIPTS = "+evalsha +eval +script|load +script|exists"
ROLE_USERS = {
    # Actors lease, commit, renew and release slots and read meta/stats. They cannot read
    # entries through the consumer group, ack, delete, or run admin commands.
    "actor": (
        f"-@all {_COMMON} +@read +@write {_SCRIPTS} {_NO_ADMIN} "
        "-xreadgroup -xack -xdel -xgroup -xclaim -xautoclaim -xtrim -del -unlink -rename "
        "-renamenx -move -copy -restore -migrate -expire -pexpire -persist"
    ),
    # The learner also consumes (XREADGROUP, XACK, XDEL via ACK/DEAD_LETTER scripts, XGROUP
    # CREATE), but cannot run admin or dangerous commands (FLUSHALL, CONFIG, SHUTDOWN, ...).
    "learner": f"-@all {_COMMON} +@read +@write +@stream {_SCRIPTS} +xgroup|create {_NO_ADMIN}",
}
"""ACL users the server creates besides ``default`` (admin); see ``RedisServer.url_for``."""

PASSWORD = re.compile(r"[A-Za-z0-9._~-]{16,}")
"""A password given in a file: URL-safe (it goes into the URLs as it is) and not short."""
MAKE_PASSWORD = "openssl rand -hex 24 | tr -d '\\n' > FILE && chmod 600 FILE"
"""How to make one, for messages."""


def read_passwords(directory: str | os.PathLike) -> dict[str, str]:
    """``{user: password}`` for each user of ``ROLE_USERS``, from the file of that name in
    ``directory`` (``buffer.passwords_dir``; e.g. a Kubernetes Secret's volume). Each file must
    be readable by its owner only and hold ``PASSWORD`` exactly: no newline, because clients
    may build their URL from the same bytes (a Secret in an environment variable), and a
    password that differs by a newline fails only there, far from its cause. Raises
    ``ValueError`` naming the file and the fix; the message never quotes a password."""
    out = {}
    for user in ROLE_USERS:
        path = Path(directory) / user
        try:
            mode = os.stat(path).st_mode
            text = path.read_text()
        except OSError as e:
            raise ValueError(
                f"{path} cannot be read ({e.strerror}); the directory needs one file per ACL "
                f"user ({', '.join(ROLE_USERS)}), each holding that user's password"
            ) from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ValueError(
                f"{path} is readable by other users (mode {stat.S_IMODE(mode):o}); it holds a "
                f"password: chmod 600 {path} (a Kubernetes Secret volume: defaultMode 0400, "
                "and no fsGroup, which adds group read)"
            )
        if not PASSWORD.fullmatch(text):
            trimmed = PASSWORD.fullmatch(text.rstrip("\r\n"))
            what = "ends with a newline" if trimmed else "holds no valid password"
            raise ValueError(
                f"{path} {what}: it must hold the password only, at least 16 of the characters "
                "A-Z a-z 0-9 . _ ~ - (the clients' URLs carry it as it is); make one with: "
                f"{MAKE_PASSWORD}"
            )
        out[user] = text
    return out


def port_lines(port: int | None, tls: TlsFiles | None) -> list[str]:
    """The config lines of the listener: a plain ``port``, or TLS only (no plain port)."""
    if tls is None:
        return [f"port {port or 0}"]
    return [
        "port 0",  # no plain-text listener at all
        f"tls-port {port}",
        f'tls-cert-file "{tls.cert}"',
        f'tls-key-file "{tls.key}"',
        f'tls-ca-cert-file "{tls.ca}"',
        "tls-auth-clients no",  # clients authenticate with their ACL user's password
    ]


def acl_lines(key_prefix: str | None, user_passwords: dict[str, str]) -> list[str]:
    """``user`` directives, one per role of ``ROLE_USERS`` (``default`` is the admin, set by
    ``requirepass``); ``key_prefix`` limits their keys to ``prefix`` and ``prefix:*``."""
    if key_prefix is None:
        keys = "~*"
    else:
        p = re.sub(r"([*?\[\]\\])", r"\\\1", key_prefix)
        keys = f"~{p} ~{p}:*"
    return [
        f"user {user} on >{user_passwords[user]} resetkeys {keys} resetchannels {rules}"
        for user, rules in ROLE_USERS.items()
    ]


def read_previous_conf(conf_path: Path) -> dict[str, str]:
    """``requirepass``, ``port`` (a TLS server's ``tls-port``) and ``user:<name>`` passwords of
    the ``redis.conf`` a previous start wrote ({} if there is none)."""
    try:
        text = conf_path.read_text()
    except OSError:
        return {}
    out = {}
    for key in ("requirepass", "port", "tls-port"):
        m = re.search(rf"^{key} (\S+)$", text, re.MULTILINE)
        if m:
            out[key] = m.group(1)
    if int(out.get("tls-port", "0")):  # a TLS server listened there (its "port" is 0)
        out["port"] = out["tls-port"]
    for user, pw in re.findall(r"^user (\w+) on >(\S+) ", text, re.MULTILINE):
        out[f"user:{user}"] = pw
    return out


def aof_hint(log_text: str, run_dir: Path) -> str:
    """A sentence naming the damaged AOF file and the fix, or "" if ``log_text`` (what
    redis-server logged since its start) shows none."""
    errors = [ln for ln in log_text.splitlines() if " # " in ln]  # redis' warning level
    if not any(w in ln for ln in errors for w in ("append only file", "AOF", "manifest")):
        return ""
    m = re.search(r"reading the append only file (\S+?):", log_text)
    aof_dir = run_dir / "appendonlydir"
    file = aof_dir / m.group(1) if m else aof_dir
    manifest = aof_dir / "appendonly.aof.manifest"
    return (
        f" The AOF is damaged ({file}); the server refused to start rather than start "
        f"with missing data. Back up {aof_dir}, then run `redis-check-aof --fix {manifest}` "
        "(it truncates the AOF at the first bad command: what follows is lost) and start "
        "again, or use a fresh run directory."
    )
