"""The weight-transport seam: what a transport is, for the learner and for the actors.

A transport moves one weight version from learner rank 0 to every receiver (the actors'
vLLM workers, or simulated engines) in the stream format of ``asyncrl.core.weights.stream``. It is one
module under ``asyncrl/core/weights/`` with a ``Sender`` and a ``Receiver`` class, named in
``asyncrl.core.weights.transports.TRANSPORTS``; nothing else in the learner or the actors changes::

    learner rank 0 (learner/weights/channel.py ActorWeightChannel)     actor engine (each worker)
    info = sender.open(world_size, network)    -- weights_init -->   receiver.join(info, rank)
    sender.connect()          <- rendezvous, bounded by timeout_s ->  (join returns)
    sender.send(named, version)     -- the stream, checked -->        receiver.receive(version,
                                                                                         load)
    sender.close()                                                    receiver.close()

``info`` is JSON (it crosses the authenticated control plane); the channel adds each
receiver's ``rank_offset``. Every wait is bounded by the group's ``timeout_s`` and ends in
``WeightSyncError``; after any failure both sides close and a new group is opened (the
channel re-forms it with the actors that answer, learner/weights/channel.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from asyncrl.core.weights.stream import LoadFn, WeightSyncError, send_stream

if TYPE_CHECKING:
    from asyncrl.core.config.network import NetworkConfig

__all__ = ["Receiver", "SendStats", "Sender", "WeightSyncError"]


@dataclass(frozen=True)
class SendStats:
    """One sync: ``bytes`` of tensor data sent, ``tensors`` sent, wall ``seconds``."""

    bytes: int
    tensors: int
    seconds: float


class Sender(Protocol):
    """Learner rank 0's end. Invariant: at most one group and one sync at a time; ``send``
    returns only after every receiver verified and loaded the version, else raises
    ``WeightSyncError`` (then ``close``, and ``open`` a new group).

    Optional capability (host transports, ``defers_ack = True``): ``send(named, version,
    wait_ack=False)`` returns once every byte is sent, and ``collect_ack(version)`` (one
    thread, before the group's next call) waits for the receivers' ack and raises as
    ``send`` would (learner/weights/channel.py ``PendingAck``)."""

    name: ClassVar[str]
    timeout_s: float

    def open(self, world_size: int, network: NetworkConfig) -> dict[str, Any]:
        """Prepare a group of ``world_size`` ranks (this sender is rank 0) and return the JSON
        init info every receiver needs (without its ``rank_offset``). Does not block."""
        ...

    def connect(self) -> None:
        """Form the group ``open`` prepared: blocks until every receiver joined, at most
        ``timeout_s``."""
        ...

    def send(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> SendStats:
        """Stream ``(hf_name, full_tensor)`` pairs as ``version``; tensors may be produced
        lazily (an FSDP gather each), at most one bucket is held at a time."""
        ...

    def close(self) -> None:
        """Drop the group (idempotent)."""
        ...


class Receiver(Protocol):
    """A receiver's end, inside an actor's engine. ``device`` is where received tensors
    land (the worker's GPU for NCCL, the host for gloo)."""

    def join(self, info: dict[str, Any], rank: int, device: torch.device | None = None) -> None:
        """Join the group of ``info`` as ``rank``; blocks until it forms, at most its
        ``timeout_s``. ``info["local_address"]``: this host's own address ('' = the
        sender's, right on one host)."""
        ...

    def receive(self, version: int, load: LoadFn) -> tuple[int, int]:
        """Receive ``version``, verify it and hand its tensors to ``load``; returns
        ``(bytes, tensors)``. Raises ``WeightSyncError`` after telling the sender."""
        ...

    def close(self) -> None:
        """Leave the group (idempotent)."""
        ...


def cast(
    named: Iterable[tuple[str, torch.Tensor]],
    wire_dtype: torch.dtype | None,
    device: torch.device | str,
):
    """Each tensor in the wire dtype, on ``device``, one at a time (lazy: a learner that
    gathers tensors one by one never holds the whole model there)."""
    for name, t in named:
        if wire_dtype is not None and t.is_floating_point():
            t = t.to(wire_dtype)
        yield name, t.to(device)


def timed_send(group, named, version: int, bucket_bytes: int, wait_ack: bool = True) -> SendStats:
    """``send_stream`` with its wall time; the shared body of every sender's ``send``."""
    if version < 0:
        raise ValueError(f"version must be >= 0, got {version}")
    t0 = time.perf_counter()
    nbytes, count = send_stream(group, named, version, bucket_bytes, wait_ack)
    return SendStats(bytes=nbytes, tensors=count, seconds=time.perf_counter() - t0)
