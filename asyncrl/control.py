"""Control plane: ZeroMQ with JSON messages between learner rank 0 and the actors.

    learner rank 0 (ROUTER, bound on loopback)  <---->  actor i (DEALER)
      <- {"type": "register", "actor_id": i}
      -> {"type": "weights_init", "rank": r, "world_size": w, "host": h, "port": p}
      -> {"type": "update", "version": v}      (then both sides enter the weight collective)
      <- {"type": "updated", "actor_id": i, "version": v}
      -> {"type": "stop"}

Tensors never travel here (they go over the weight-transfer collective); nothing is pickled.
The learner publishes its address in the buffer's metadata (``control_addr``).
"""

from __future__ import annotations

import json

import zmq


def _encode(msg: dict) -> bytes:
    return json.dumps(msg).encode()


def _decode(raw: bytes) -> dict:
    msg = json.loads(raw.decode())
    if not isinstance(msg, dict) or "type" not in msg:
        raise ValueError(f"control message without a type: {raw[:80]!r}")
    return msg


class ControlServer:
    """Learner side. ``host`` is loopback unless configured otherwise."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if port:
            self._sock.bind(f"tcp://{host}:{port}")
        else:
            port = self._sock.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self.actors: dict[int, bytes] = {}

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
        """Block until ``count`` actors registered. ``wait`` (``asyncrl.waiting.Wait``) reports
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
        self._sock.close(0)


class ControlClient:
    """Actor side (asyncio)."""

    def __init__(self, address: str, actor_id: int) -> None:
        self.actor_id = actor_id
        self._sock = None
        self.connect(address)

    def connect(self, address: str) -> None:
        """(Re)connect to the learner at ``address``; messages queued for the old one drop."""
        import zmq.asyncio

        if self._sock is not None:
            self._sock.close(0)
        self._sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(address)
        self.address = address

    async def send(self, msg: dict) -> None:
        await self._sock.send(_encode({**msg, "actor_id": self.actor_id}))

    async def recv(self, timeout_s: float) -> dict | None:
        if not await self._sock.poll(int(timeout_s * 1000)):
            return None
        return _decode(await self._sock.recv())

    def close(self) -> None:
        self._sock.close(0)
