"""The weight-transport seam: what a transport is, for the learner and for the actors.

A transport moves one weight version from learner rank 0 to every receiver (the actors'
vLLM workers, or simulated engines) in the stream format of ``asyncrl.core.weights``. It is one
module under ``asyncrl/core/transports/`` with a ``Sender`` and a ``Receiver`` class, named in
``asyncrl.core.transports.TRANSPORTS``; nothing else in the learner or the actors changes::

    learner rank 0 (learner/weight_sender.py ActorWeightChannel)     actor engine (each worker)
    info = sender.open(world_size, network)    -- weights_init -->   receiver.join(info, rank)
    sender.connect()          <- rendezvous, bounded by timeout_s ->  (join returns)
    sender.send(named, version)     -- the stream, checked -->        receiver.receive(version,
                                                                                         load)
    sender.close()                                                    receiver.close()

``info`` is JSON (it crosses the authenticated control plane); the channel adds each
receiver's ``rank_offset``. Every wait is bounded by the group's ``timeout_s`` and ends in
``WeightSyncError``; after any failure both sides close and a new group is opened (the
channel re-forms it with the actors that answer, learner/weight_sender.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from asyncrl.core.weights import LoadFn, WeightSyncError

if TYPE_CHECKING:
    from asyncrl.core.config_network import NetworkConfig

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
    ``send`` would (learner/weight_sender.py ``PendingAck``)."""

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
