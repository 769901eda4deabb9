"""The buffer's ``<buffer.name>:endpoints`` hash: where each process serves ``/metrics``, and
on which host, for ``asyncrl status`` (and a Prometheus file-based service discovery).

    field                      process
    launcher                   ``asyncrl run``
    launcher-<role>@<where>    ``asyncrl launch <role>``, one per host (``launcher_role``)
    learner, actor<i>          learner rank 0, actor i

    value   {"metrics": "127.0.0.1:9493", "host": "nodeB", "address": "10.0.0.7",
             "netns": "<boot id>/<network namespace inode>", "pid": 4242, "gpus": "2,3"}

Endpoints bind loopback only (they have no authentication), so an endpoint can be scraped
only from the host, and the network namespace, that registered it. ``netns`` says exactly
that: the kernel's boot id (different on every machine) and the inode of the process's
network namespace (different for every namespace of one kernel, e.g. the "hosts" of
``tests/multihost/netns.py``, which share the host name). ``host`` and ``address``
(``network.address``, where the job's peers reach the host) are for people. A value in the
old plain ``host:port`` form (an older version's job) says nothing about its host and is
taken as this host's, as before. ``gpus`` (only when non-empty) is the process's own
``CUDA_VISIBLE_DEVICES``, which the launcher set from the GPU plan (asyncrl/orchestration/placement/plan.py).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from asyncrl.core.config.network import NetworkConfig, is_loopback

if TYPE_CHECKING:
    import redis


@dataclass(frozen=True)
class Place:
    """Where a process runs."""

    host: str
    """``socket.gethostname()``."""
    address: str = ""
    """``network.address`` of its launch: where the job's peers reach that host."""
    netns: str = ""
    """``<boot id>/<network namespace inode>``: equal iff two processes share a loopback;
    '' where ``/proc`` does not say (not Linux)."""

    @classmethod
    def here(cls, address: str = "") -> Place:
        return cls(socket.gethostname(), address, _netns())

    def shares_loopback(self, other: Place) -> bool:
        """Whether ``127.0.0.1`` is the same for both: the same kernel and network namespace,
        or, where one of them could not tell, the same host name."""
        if self.netns and other.netns:
            return self.netns == other.netns
        return self.host == other.host

    def describe(self) -> str:
        """``nodeB (10.0.0.7)``; the address only when it says more than the name."""
        if not self.address or is_loopback(self.address) or self.address == self.host:
            return self.host
        return f"{self.host} ({self.address})"


def _netns() -> str:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        inode = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return ""
    return f"{boot}/{inode}"


@dataclass(frozen=True)
class Endpoint:
    """One process's ``/metrics``."""

    role: str
    metrics: str
    """``host:port`` on the loopback of ``place``."""
    place: Place | None
    """None: registered by an older version, which did not record where."""
    pid: int = 0
    gpus: str = ""
    """The process's ``CUDA_VISIBLE_DEVICES`` ('' = not set, or a launcher)."""

    def scrapable_from(self, here: Place) -> bool:
        return self.place is None or self.place.shares_loopback(here)

    def to_json(self) -> str:
        """The hash value (``parse_endpoint`` reads it back)."""
        if self.place is None:
            return self.metrics
        gpus = {"gpus": self.gpus} if self.gpus else {}
        record = {"metrics": self.metrics, **asdict(self.place), "pid": self.pid, **gpus}
        return json.dumps(record)


def launcher_role(role: str, network: NetworkConfig) -> str:
    """The field of ``asyncrl launch <role>`` on this host, ``launcher-<role>@<where>``:
    ``<where>`` is the address the job's peers reach this host at (unique per host of a
    multi-host job), or the host name for a launch confined to loopback."""
    where = socket.gethostname() if network.local else network.address
    return f"launcher-{role}@{where}"


def register_endpoint(
    client: redis.Redis,
    buffer_name: str,
    role: str,
    port: int,
    network: NetworkConfig,
    gpus: str | None = None,
) -> None:
    """Record that ``role`` serves ``/metrics`` on ``network.metrics:port`` of this host
    (nothing when ``port`` is 0: metrics off), with its GPUs: ``gpus``, None = this
    process's ``CUDA_VISIBLE_DEVICES``."""
    if port:
        here = Place.here(network.address)
        if gpus is None:
            gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        endpoint = Endpoint(role, f"{network.metrics}:{port}", here, os.getpid(), gpus)
        client.hset(f"{buffer_name}:endpoints", role, endpoint.to_json())


def parse_endpoint(role: str, raw: str) -> Endpoint:
    """A field of the endpoints hash: the JSON record, or an older version's ``host:port``."""
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):  # "127.0.0.1:9491" is not JSON; "9491" would be an int
        return Endpoint(role, raw, None)
    place = Place(**{f.name: str(value.get(f.name, "")) for f in fields(Place)})
    pid = value.get("pid")
    pid = pid if isinstance(pid, int) else 0
    gpus = value.get("gpus")
    gpus = gpus if isinstance(gpus, str) else ""
    return Endpoint(role, str(value.get("metrics", "")), place, pid, gpus)


def read_endpoints(client: redis.Redis, buffer_name: str) -> dict[str, Endpoint]:
    """role -> ``Endpoint`` for every process of the job that registered one."""
    raw = client.hgetall(f"{buffer_name}:endpoints")
    return {_text(k): parse_endpoint(_text(k), _text(v)) for k, v in raw.items()}


def _text(x: bytes | str) -> str:
    """A reply of a client with or without ``decode_responses``."""
    return x.decode() if isinstance(x, bytes) else x
