"""Trainer side of the gloo weight transfer: learner rank 0 streams full weights to actors.

``WeightSender`` is the learner's handle (torch only, no vLLM import)::

    sender = WeightSender(bucket_bytes=64 << 20, timeout_s=120)
    sender.connect(port=29600, world_size=1 + n_actor_workers)   # blocks until all joined
    stats = sender.send(model.state_dict().items(), version=V)    # while actors receive
    sender.close()

Actors join the same group with ``ActorEngine.join_weight_sync(sender.worker_init_info(...))``
and receive with ``ActorEngine.update_weights(V)``; "version V is ready" travels over the
control plane, so ``send`` and the actors' ``update_weights`` run concurrently.

For code written against vLLM's own trainer API, ``learner.vllm_trainer`` wraps
``WeightSender`` as vLLM's ``TrainerWeightTransferEngine`` (a module of its own, so importing
the learner does not import vLLM); ``actors.vllm_plugin`` registers it as ``"gloo"``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from asyncrl.config_network import NetworkConfig
from asyncrl.weights import (
    DEFAULT_BUCKET_BYTES,
    DEFAULT_TIMEOUT_S,
    LOOPBACK,
    GlooGroup,
    WeightSyncError,
    send_stream,
)

__all__ = ["ActorWeightChannel", "SendStats", "WeightSender", "WeightSyncError"]


@dataclass(frozen=True)
class SendStats:
    """One sync: ``bytes`` of tensor data sent, ``tensors`` sent, wall ``seconds``."""

    bytes: int
    tensors: int
    seconds: float


class WeightSender:
    """Rank 0 of a private gloo group whose other ranks are the actors' vLLM workers.

    Invariant: at most one sync in flight; ``send`` either returns after every receiver
    verified and loaded the weights, or raises ``WeightSyncError`` (the group is then
    unusable: ``close`` it and ``connect`` again, and the actors re-join).
    """

    def __init__(
        self,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        wire_dtype: torch.dtype | None = None,
    ):
        """``bucket_bytes``: packing unit per broadcast; ``timeout_s``: deadline of the
        rendezvous and of every collective; ``wire_dtype``: cast floating tensors to this
        dtype before sending (e.g. bfloat16 to halve the bytes), None sends them as given."""
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.bucket_bytes = bucket_bytes
        self.timeout_s = timeout_s
        self.wire_dtype = wire_dtype
        self._group: GlooGroup | None = None
        self.address: str = LOOPBACK
        self.bind: str = LOOPBACK
        self.port: int = 0
        self.world_size: int = 0

    @staticmethod
    def worker_init_info(
        address: str,
        port: int,
        world_size: int,
        rank_offset: int = 1,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> dict[str, Any]:
        """The ``init_info`` an actor passes to ``join_weight_sync``: its workers take group
        ranks ``rank_offset, rank_offset+1, ...`` (one per worker of that actor)."""
        return {
            "master_address": address,
            "master_port": port,
            "world_size": world_size,
            "rank_offset": rank_offset,
            "timeout_s": timeout_s,
        }

    def connect(self, port: int, world_size: int, address: str = LOOPBACK, bind: str = "",
                interface: str = "") -> None:  # fmt: skip
        """Host the rendezvous on ``bind:port`` (default ``address``, where receivers
        connect) with gloo on ``interface`` (default ``address``), and wait (up to
        ``timeout_s``) until all ``world_size - 1`` receivers have joined. Raises
        WeightSyncError on timeout."""
        self.close()
        self._group = GlooGroup(address, port, 0, world_size, self.timeout_s,
                                local_address=interface, bind=bind)  # fmt: skip
        self.address, self.bind, self.port, self.world_size = (
            address,
            bind or address,
            port,
            world_size,
        )

    @property
    def connected(self) -> bool:
        return self._group is not None

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> SendStats:
        """Stream ``(hf_name, full_tensor)`` pairs as weight version ``version``.

        Tensors may be produced lazily (e.g. FSDP ``full_tensor()`` one at a time); at most
        one bucket is held at once. Returns after every receiver acknowledged.
        """
        if self._group is None:
            raise WeightSyncError("WeightSender.send before connect")
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        t0 = time.perf_counter()
        nbytes, count = send_stream(
            self._group, self._cast(named_tensors), version, self.bucket_bytes
        )
        return SendStats(bytes=nbytes, tensors=count, seconds=time.perf_counter() - t0)

    def _cast(self, named: Iterable[tuple[str, torch.Tensor]]):
        """Host tensors in the wire dtype (the gloo group moves host memory; a no-op for the
        host copies the trainer already makes, ``learner.trainer._sync_weights``)."""
        for name, t in named:
            if self.wire_dtype is not None and t.is_floating_point():
                t = t.to(self.wire_dtype)
            yield name, t.cpu()

    def close(self) -> None:
        """Tear down the group (idempotent)."""
        if self._group is not None:
            self._group.close()
            self._group = None


class ActorWeightChannel:
    """Learner rank 0's weight channel to the actors: the control plane + a ``WeightSender``
    whose group is rebuilt when a receiver dies (issue 5, guarantee 8).

    ``sync(named, version)``:

    1. drains the control plane: an actor that (re-)registered (a restarted actor) or that
       is alive but outside the group is scheduled to join;
    2. rebuilds the group if its membership must change: a new port and store, ranks
       ``1..n`` for the members in actor-id order, ``weights_init`` to each member (every
       group after the first is logged, ``weight sync: new group with actors [...]``);
    3. sends ``{"type": "update", "version"}`` to the members and streams the weights. If that
       fails (``WeightSyncError``: a receiver died mid-transfer, a deadline passed, a receiver
       rejected the sync), it closes the group, asks every registered actor ``ping`` and
       rebuilds with those that answer ``pong`` within ``ping_s`` (default ``timeout_s + 5``:
       a survivor may be stuck in the failed collective until its deadline; the round ends
       as soon as every registered actor answered), then sends the same version
       again in full, so every survivor ends with identical weights. At most
       ``max_attempts`` tries; then it raises ``WeightSyncError`` naming what failed.

    Every wait is bounded: ``timeout_s`` per rendezvous and per collective, ``ping_s`` per
    liveness round. A restarted actor gets the current weights in the first sync after it
    registers (a full send). Actors must answer ``ping`` with ``{"type": "pong", "nonce"}``
    and, when a receive fails, stay alive and wait for the next ``weights_init``; an actor
    that instead exits is simply left out until it registers again.
    """

    def __init__(self, control, timeout_s: float = DEFAULT_TIMEOUT_S, ping_s: float | None = None,
                 max_attempts: int = 3, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 log=print, wire_dtype: torch.dtype | None = None,
                 stop: Callable[[], bool] = lambda: False,
                 network: NetworkConfig | None = None) -> None:  # fmt: skip
        """``network``: where the group's store binds and what the actors are told (its
        ``address``); loopback by default."""
        self.control = control
        self.network = network or NetworkConfig()
        self.stop = stop
        """True once the learner is asked to stop: a failed sync is then not retried and a
        liveness round ends at once (the actors are being stopped too)."""
        self.sender = WeightSender(bucket_bytes=bucket_bytes, timeout_s=timeout_s,
                                   wire_dtype=wire_dtype)  # fmt: skip
        # a survivor may sit in the failed collective until its own deadline before it can
        # answer, so the liveness round outlasts the collective deadline
        self.ping_s = timeout_s + 5.0 if ping_s is None else ping_s
        self.timeout_s, self.max_attempts = timeout_s, max_attempts
        self.log = log
        self.members: list[int] = []
        self.failures = 0
        """Syncs that failed (and were retried with a rebuilt group)."""
        self.rebuilds = 0
        """Groups formed, including the first."""
        self._dirty = True

    def open(self) -> ActorWeightChannel:
        """Form the first group with every registered actor; returns self."""
        self._rebuild(sorted(self.control.actors), reason=None)
        return self

    def sync(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> SendStats:
        """Send ``named`` as ``version`` to every live actor (see class docstring)."""
        named = list(named)  # may be sent twice
        self._drain()
        error: Exception | None = None
        for attempt in range(self.max_attempts):
            try:
                if error is not None:
                    self._rebuild(self._ping(), "after the failure above")
                elif self._dirty:
                    self._rebuild(self._candidates(), "an actor registered or was outside it")
                if not self.members:
                    return SendStats(bytes=0, tensors=0, seconds=0.0)
                for actor_id in self.members:
                    self.control.send(actor_id, {"type": "update", "version": version})
                return self.sender.send(named, version)
            except WeightSyncError as e:
                error = e
                self.failures += 1
                self.sender.close()
                if self.stop():
                    self.log(f"weight sync {version} failed while stopping ({e}); not retried")
                    return SendStats(bytes=0, tensors=0, seconds=0.0)
                self.log(f"weight sync {version} failed (attempt {attempt + 1}/"
                         f"{self.max_attempts}, members {self.members}): {e}; rebuilding the "
                         "group with the actors that answer")  # fmt: skip
        raise WeightSyncError(
            f"weight sync {version} failed {self.max_attempts} times, last: {error}. Check "
            "the actor logs; an actor that cannot receive weights must be restarted"
        ) from error

    def rejoin_pending(self) -> bool:
        """Read the control plane now; True if the next sync will rebuild the group (an
        actor registered again, or a live actor is outside the group)."""
        self._drain()
        return self._dirty

    def _candidates(self) -> list[int]:
        """Members for a rebuild that no failure forced: every registered actor."""
        return sorted(self.control.actors)

    def _drain(self) -> None:
        """Read pending control messages; a (re-)registration or a live non-member means the
        group must be rebuilt before the next send."""
        while (msg := self.control.recv(0)) is not None:
            self._note(msg)

    def _note(self, msg: dict) -> None:
        actor_id = msg.get("actor_id")
        if msg["type"] == "register" or (actor_id is not None and actor_id not in self.members):
            self._dirty = True

    def _ping(self) -> list[int]:
        """Actors that answer a ping within ``ping_s`` (every registered one is asked)."""
        import secrets

        nonce = secrets.token_hex(4)
        self.control.broadcast({"type": "ping", "nonce": nonce})
        alive: set[int] = set()
        deadline = time.monotonic() + self.ping_s
        while time.monotonic() < deadline and len(alive) < len(self.control.actors):
            if self.stop():
                break
            msg = self.control.recv(0.05)
            if msg is None:
                continue
            self._note(msg)
            # a (re-)registration is a live actor too: a restarted one never saw this ping
            if msg["type"] == "register" or (msg["type"] == "pong" and msg.get("nonce") == nonce):
                alive.add(int(msg["actor_id"]))
        return sorted(alive)

    def _rebuild(self, actor_ids: list[int], reason: str | None) -> None:
        """A new group (new port, new store) whose receivers are ``actor_ids``. Once it is
        formed it is counted in ``rebuilds`` and, unless ``reason`` is None (the first group),
        logged with it: the log lines and the count agree."""
        from asyncrl.torchrun import free_port as _free_port

        self.sender.close()
        self.members, self._dirty = list(actor_ids), False
        if not self.members:
            self.log("weight sync: no live actor; the next sync retries when one registers")
            return
        net = self.network
        port, world = _free_port(net.bind), 1 + len(self.members)
        for i, actor_id in enumerate(self.members):
            info = WeightSender.worker_init_info(net.address, port, world, rank_offset=1 + i,
                                                 timeout_s=self.timeout_s)  # fmt: skip
            self.control.send(actor_id, {"type": "weights_init", **info})
        self._dirty = True  # until connect succeeds
        self.sender.connect(port, world, net.address, bind=net.bind, interface=net.interface)
        self._dirty = False
        self.rebuilds += 1
        if reason is not None:
            self.log(f"weight sync: new group with actors {self.members} ({reason})")

    def close(self) -> None:
        self.sender.close()
