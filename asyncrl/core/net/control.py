"""Control plane: ZeroMQ with JSON messages between learner rank 0 and the actors.

    learner rank 0 (ROUTER, bound on network.bind)  <---->  actor i (DEALER)
      <- {"type": "register", "actor_id": i}
      -> {"type": "weights_init", "transport": t, "rank_offset": r, ...}   (the
         transport's own JSON: asyncrl/core/weights/base.py)
      -> {"type": "update", "version": v}      (then both sides enter the weight collective)
      <- {"type": "updated", "actor_id": i, "version": v}
      -> {"type": "stop"}

Tensors never travel here (they go over the weight-transfer collective); nothing is pickled.

Authenticated and encrypted with CURVE, on loopback too (one path). Each learner start makes
fresh keys (``ControlKeys``): the server's key pair and one client key pair for the actors.
It publishes its advertised address and the keys the actors need in the buffer's metadata
(``control_addr``, ``control_keys``), which only holders of the job's Redis credentials can
read; the server admits only the job's client key (a ZAP handler), so a peer without the
keys cannot register or send a command: its handshake fails before any message is read.
"""

from __future__ import annotations

import errno
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import zmq
from zmq.auth.thread import ThreadAuthenticator

if TYPE_CHECKING:
    import zmq.asyncio

from asyncrl.core.runtime.fatal import FatalError


@dataclass(frozen=True)
class ControlKeys:
    """CURVE keys of one learner start (Z85 text). The actors get ``public()``: the server's
    public key and the shared client key pair; the server's secret key never leaves it."""

    server_public: str
    server_secret: str
    client_public: str
    client_secret: str

    @classmethod
    def generate(cls) -> ControlKeys:
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        return cls(
            *(k.decode() for k in (server_public, server_secret, client_public, client_secret))
        )

    def for_actors(self) -> str:
        """JSON for the buffer meta's ``control_keys``."""
        return json.dumps(
            {
                "server_public": self.server_public,
                "client_public": self.client_public,
                "client_secret": self.client_secret,
            }
        )


@dataclass(frozen=True)
class Endpoint:
    """Where an actor reaches the learner: its address and the keys to do it with."""

    address: str
    server_public: str
    client_public: str
    client_secret: str

    @classmethod
    def from_meta(cls, meta: dict) -> Endpoint | None:
        """The endpoint a learner published in the buffer meta; None before it did. Raises
        ``ValueError`` naming the key when the meta is damaged."""
        address, keys = meta.get("control_addr"), meta.get("control_keys")
        if not address or not keys:
            return None
        try:
            k = json.loads(keys)
            return cls(address, k["server_public"], k["client_public"], k["client_secret"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"the buffer meta's control_keys cannot be read ({e!r})") from None


def _encode(msg: dict) -> bytes:
    return json.dumps(msg).encode()


def _decode(raw: bytes) -> dict:
    msg = json.loads(raw.decode())
    if not isinstance(msg, dict) or "type" not in msg:
        raise ValueError(f"control message without a type: {raw[:80]!r}")
    return msg


class _OnlyKey:
    """ZAP credentials provider: admit exactly one client public key."""

    def __init__(self, key: str) -> None:
        self.key = key.encode()

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.key


class ControlServer:
    """Learner side: binds ``host`` (``network.bind``) and announces ``advertise`` (where
    actors connect; '' = ``host``). Only clients holding ``keys.client_secret`` get in."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise: str = "",
        keys: ControlKeys | None = None,
    ) -> None:
        self.keys = keys or ControlKeys.generate()
        self._ctx = zmq.Context()
        self._auth = ThreadAuthenticator(self._ctx)
        # a socket once __init__ returns; None only for close() on the failure path below
        self._sock: zmq.Socket = None  # type: ignore[assignment]
        try:  # a failed bind must not leave the auth thread and the context behind
            self._auth.start()
            self._auth.configure_curve_callback("*", _OnlyKey(self.keys.client_public))
            self._sock = self._ctx.socket(zmq.ROUTER)
            self._sock.setsockopt(zmq.LINGER, 0)
            self._sock.curve_server = True
            self._sock.curve_secretkey = self.keys.server_secret.encode()
            port = _bind(self._sock, host, port)
        except BaseException:
            self.close()
            raise
        self.address = f"tcp://{advertise or host}:{port}"
        self.actors: dict[int, bytes] = {}

    def meta(self) -> dict[str, str]:
        """What the actors need, for the buffer meta (``Endpoint.from_meta`` reads it)."""
        return {"control_addr": self.address, "control_keys": self.keys.for_actors()}

    def recv(self, timeout_s: float) -> dict | None:
        """One message (with ``_from`` identity) or None on timeout."""
        if not self._sock.poll(int(timeout_s * 1000)):
            return None
        ident, raw = self._sock.recv_multipart()
        msg = _decode(raw)
        if msg["type"] == "register":
            self.actors[int(msg["actor_id"])] = ident
        msg["_from"] = ident
        return msg

    def wait_for_actors(self, count: int, wait) -> None:
        """Block until ``count`` actors registered. ``wait`` (``asyncrl.core.runtime.waiting.Wait``) reports
        progress, raises ``TimeoutError`` at its deadline and ``StopRequested`` on a stop."""
        while len(self.actors) < count:
            wait.check(f"{len(self.actors)}/{count} registered: {sorted(self.actors)}")
            self.recv(0.2)

    def send(self, actor_id: int, msg: dict) -> None:
        self._sock.send_multipart([self.actors[actor_id], _encode(msg)])

    def broadcast(self, msg: dict) -> None:
        for actor_id in sorted(self.actors):
            self.send(actor_id, msg)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
        self._auth.stop()
        self._ctx.term()


def _bind(sock, host: str, port: int) -> int:
    """Bind ``sock`` on ``host`` (``port`` 0: a free one); returns the port. A failure names
    the address and ``network.bind``; an address this host does not hold is a ``FatalError``
    (a restart binds it no better)."""
    try:
        if port:
            sock.bind(f"tcp://{host}:{port}")
            return port
        return sock.bind_to_random_port(f"tcp://{host}")
    except zmq.ZMQError as e:
        code = cast(int, e.errno)  # ZMQError takes zmq_errno() when raised without one
        said = f"the control plane cannot bind tcp://{host}:{port or '*'} ({zmq.strerror(code)})"
        if e.errno == errno.EADDRNOTAVAIL:
            raise FatalError(
                f"{said}: network.bind={host!r} is not an address of this host; set "
                "network.bind to one of its addresses"
            ) from e
        hint = "another process holds the port; " if e.errno == errno.EADDRINUSE else ""
        raise RuntimeError(f"{said}; {hint}check network.bind={host!r}") from e


class ControlClient:
    """Actor side (asyncio)."""

    def __init__(self, endpoint: Endpoint, actor_id: int) -> None:
        self.actor_id = actor_id
        self._sock: zmq.asyncio.Socket = None  # type: ignore[assignment]  # connect() sets it
        self.connect(endpoint)

    def connect(self, endpoint: Endpoint) -> None:
        """(Re)connect to the learner at ``endpoint``; messages queued for the old one drop."""
        import zmq.asyncio

        if self._sock is not None:
            self._sock.close(0)
        sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.curve_serverkey = endpoint.server_public.encode()
        sock.curve_publickey = endpoint.client_public.encode()
        sock.curve_secretkey = endpoint.client_secret.encode()
        sock.connect(endpoint.address)
        self._sock, self.endpoint = sock, endpoint

    @property
    def address(self) -> str:
        return self.endpoint.address

    async def send(self, msg: dict) -> None:
        await self._sock.send(_encode({**msg, "actor_id": self.actor_id}))

    async def recv(self, timeout_s: float) -> dict | None:
        if not await self._sock.poll(int(timeout_s * 1000)):
            return None
        return _decode(await self._sock.recv())

    def close(self) -> None:
        self._sock.close(0)
