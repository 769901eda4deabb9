"""The ``network`` config group: where this launch's services listen and how peers reach them.

Every listener of a launch binds ``network.bind``: the private Redis (``asyncrl run`` /
``asyncrl launch buffer``), the learner's control plane and weight-group store, the gloo
sockets of the learner ranks and of the actors' weight receivers, and torchrun's rendezvous.
Peers are told ``network.advertise`` (through the buffer meta). Loopback is the default, so a
job on one machine is reachable from nowhere else. The metrics endpoints bind
``network.metrics`` (loopback too). Each host of a multi-node job sets its own ``bind``
(docs/multinode.md).
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

from asyncrl.core.config.checks import require as _require

LOOPBACK = "127.0.0.1"
_WILDCARDS = ("0.0.0.0",)


def is_loopback(host: str) -> bool:
    """``127.x``, ``::1`` and ``localhost`` are loopback; any other name or address is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_ip(host: str) -> bool:
    """An IPv4 address (IPv6 is not supported: the control plane and the port probes are
    IPv4-only)."""
    try:
        ipaddress.IPv4Address(host)
        return True
    except ValueError:
        return False


@dataclass
class NetworkConfig:
    """Addresses of this launch (one host). See docs/multinode.md."""

    bind: str = LOOPBACK
    """The IP address this launch's listeners bind: Redis, the control plane, the weight
    group, gloo, torchrun. Loopback by default; on a cluster, this host's address on the
    cluster network (``0.0.0.0`` binds every interface and needs ``network.advertise``).
    Off loopback every service authenticates (docs/multinode.md, "Security")."""
    advertise: str = ""
    """The address other hosts use to reach this one (published in the buffer meta); '' =
    ``network.bind``. Set it when binding ``0.0.0.0`` or behind NAT."""
    metrics: str = LOOPBACK
    """The address the Prometheus ``/metrics`` endpoints bind. They have no authentication,
    so only loopback is accepted: scrape them with a node-local agent."""

    def __post_init__(self) -> None:
        _require(
            _is_ip(self.bind),
            f"network.bind={self.bind!r} is not an IPv4 address; give this host's address on "
            "the cluster network (e.g. 10.0.0.5), 0.0.0.0 for every interface, or 127.0.0.1",
        )
        _require(
            not self.advertise or _is_ip(self.advertise) or _is_hostname(self.advertise),
            f"network.advertise={self.advertise!r} is neither an IP address nor a host name",
        )
        _require(
            self.bind not in _WILDCARDS or _is_ip(self.advertise),
            f"network.bind={self.bind} listens on every interface, so peers cannot be told "
            "where to connect; set network.advertise=<this host's IPv4 address on the cluster "
            "network> (gloo binds it)",
        )
        _require(
            is_loopback(self.metrics),
            f"network.metrics={self.metrics!r}: the metrics endpoints have no authentication "
            "and must stay on loopback; scrape them with a Prometheus agent on each node",
        )

    @property
    def address(self) -> str:
        """Where peers reach this host: ``advertise``, else ``bind``."""
        return self.advertise or self.bind

    @property
    def interface(self) -> str:
        """The one address of this host that sockets needing a single interface bind (gloo):
        ``bind``, or ``advertise`` when ``bind`` is every interface."""
        return self.advertise if self.bind in _WILDCARDS else self.bind

    @property
    def local(self) -> bool:
        """Everything on loopback: the job is reachable from this machine only."""
        return is_loopback(self.bind)


def _is_hostname(name: str) -> bool:
    labels = name.rstrip(".").split(".")
    return bool(name) and all(
        0 < len(lb) <= 63 and lb.replace("-", "").isalnum() and not lb.startswith("-")
        for lb in labels
    )


def is_endpoint(text: str) -> bool:
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) <= 65535


def check_buffer_url(url: str | None, network: NetworkConfig) -> None:
    """Off loopback, Redis must authenticate: a ``buffer.url`` to another host, or any URL
    in a job that binds beyond loopback, needs a password."""
    if not url:
        return
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    remote = parts.scheme != "unix" and not is_loopback(parts.hostname or "")
    _require(
        bool(parts.password) or not (remote or not network.local),
        f"buffer.url has no password and the job is not confined to loopback (host "
        f"{parts.hostname!r}, network.bind={network.bind}); use the URL `asyncrl launch "
        "buffer` writes (redis://USER:PASSWORD@HOST:PORT/0), or a Redis with requirepass/ACL",
    )


def mask_url(url: str) -> str:
    """``redis://:secret@host:1/0`` -> ``redis://:***@host:1/0`` (any scheme; for messages,
    config files and trackers: the one place a URL's password is masked)."""
    import re

    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def check_buffer_tls(url: str | None, tls_dir: str) -> None:
    """A ``rediss://`` URL's CA file exists here; ``buffer.tls_dir`` goes with a TLS URL."""
    from urllib.parse import parse_qs, urlsplit

    if not url:
        return
    parts = urlsplit(url)
    if parts.scheme == "rediss":
        for ca in parse_qs(parts.query).get("ssl_ca_certs", []):
            _require(
                os.path.isfile(ca),
                f"buffer.url verifies the server with ssl_ca_certs={ca}, which is not a file "
                "on this host; copy <buffer.tls_dir>/ca.crt from the host of `asyncrl launch "
                "buffer` to that path (or share the directory)",
            )
    _require(
        not tls_dir or parts.scheme in ("rediss", "unix"),
        f"buffer.tls_dir={tls_dir} but buffer.url is plain {parts.scheme}://: use the "
        "rediss:// URL file that `asyncrl launch buffer buffer.tls_dir=...` wrote",
    )


def read_secret_file(path: str, key: str) -> str:
    """The first line of a file only its owner can read (mode 0600 or stricter)."""
    import os
    import stat

    try:
        mode = os.stat(path).st_mode
        with open(path) as f:
            text = f.read().strip()
    except OSError as e:
        _require(False, f"{key}={path!r} cannot be read: {e.strerror}")
    _require(
        not mode & (stat.S_IRWXG | stat.S_IRWXO),
        f"{key}={path!r} is readable by other users (mode {stat.S_IMODE(mode):o}); it holds a "
        f"password: chmod 600 {path}",
    )
    _require(bool(text), f"{key}={path!r} is empty; it should hold redis://USER:PASSWORD@...")
    return text.splitlines()[0]
