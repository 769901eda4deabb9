"""Trainer side of the gloo weight transfer: learner rank 0 streams full weights to actors.

``WeightSender`` is the learner's handle (torch only, no vLLM import)::

    sender = WeightSender(bucket_bytes=64 << 20, timeout_s=120)
    sender.connect(port=29600, world_size=1 + n_actor_workers)   # blocks until all joined
    stats = sender.send(model.state_dict().items(), version=V)    # while actors receive
    sender.close()

Actors join the same group with ``ActorEngine.join_weight_sync(sender.worker_init_info(...))``
and receive with ``ActorEngine.update_weights(V)``; "version V is ready" travels over the
control plane, so ``send`` and the actors' ``update_weights`` run concurrently.

For code written against vLLM's own trainer API, ``GlooTrainerWeightTransferEngine`` (built
lazily by this module's ``__getattr__`` so importing the learner does not import vLLM) is
registered as ``"gloo"`` in ``WeightTransferTrainerFactory`` by ``actors.vllm_plugin``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from asyncrl.weights import (
    DEFAULT_BUCKET_BYTES,
    DEFAULT_TIMEOUT_S,
    LOOPBACK,
    GlooGroup,
    WeightSyncError,
    send_stream,
)

__all__ = ["SendStats", "WeightSender", "WeightSyncError"]


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

    def connect(self, port: int, world_size: int, address: str = LOOPBACK) -> None:
        """Host the rendezvous at ``address:port`` and wait (up to ``timeout_s``) until all
        ``world_size - 1`` receivers have joined. Raises WeightSyncError on timeout."""
        self.close()
        self._group = GlooGroup(address, port, 0, world_size, self.timeout_s)
        self.address, self.port, self.world_size = address, port, world_size

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
        for name, t in named:
            if self.wire_dtype is not None and t.is_floating_point():
                t = t.to(self.wire_dtype)
            yield name, t

    def close(self) -> None:
        """Tear down the group (idempotent)."""
        if self._group is not None:
            self._group.close()
            self._group = None


def _build_vllm_trainer_engine() -> dict[str, type]:
    """Define the vLLM ``TrainerWeightTransferEngine`` adapter (imports vLLM, so lazily)."""
    from dataclasses import field
    from typing import ClassVar

    from vllm.distributed.weight_transfer.base import (
        TrainerInitInfo,
        TrainerWeightTransferEngine,
    )

    @dataclass
    class GlooTrainerInitInfo(TrainerInitInfo):
        """Trainer init info for the ``gloo`` backend (``rank`` 0 is the sender)."""

        backend: ClassVar[str] = "gloo"
        master_address: str = LOOPBACK
        master_port: int = 29600
        world_size: int = 2
        timeout_s: float = DEFAULT_TIMEOUT_S
        bucket_bytes: int = field(default=DEFAULT_BUCKET_BYTES)

    class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
        """vLLM-API wrapper over ``WeightSender``: drives the worker RPCs via ``client``.

        ``send_weights(version)`` replays the ``WeightSource`` once; without a version it
        sends ``last version + 1``. Non-sender ranks only iterate the source (FSDP gathers).
        """

        init_info_cls = GlooTrainerInitInfo

        def __init__(self, *, client, source, is_sender: bool = True, sender=None):
            super().__init__(client=client, source=source, is_sender=is_sender)
            self.sender: WeightSender | None = sender
            self.version = 0

        @classmethod
        def trainer_init(cls, init_info, *, client, source=None):
            if source is None:
                raise ValueError("gloo trainer weight transfer requires a WeightSource")
            if not init_info.is_sender:
                return cls(client=client, source=source, is_sender=False)
            sender = WeightSender(init_info.bucket_bytes, init_info.timeout_s)
            info = WeightSender.worker_init_info(
                init_info.master_address,
                init_info.master_port,
                init_info.world_size,
                timeout_s=init_info.timeout_s,
            )
            # Workers block in the rendezvous inside this RPC, so run it beside connect().
            with ThreadPoolExecutor(max_workers=1) as exe:
                fut = exe.submit(client.init_weight_transfer_engine, info)
                sender.connect(
                    init_info.master_port, init_info.world_size, init_info.master_address
                )
                fut.result()
            return cls(client=client, source=source, sender=sender)

        def send_weights(self, version: int | None = None) -> None:
            self.version = self.version + 1 if version is None else version
            if not self.is_sender:
                for _ in self.source:
                    pass
                return
            assert self.sender is not None
            self.client.start_weight_update()
            exe = ThreadPoolExecutor(max_workers=1)
            try:
                fut = exe.submit(self.client.update_weights, {"version": self.version})
                self.sender.send(iter(self.source), self.version)
                fut.result()
            finally:
                exe.shutdown(wait=False)  # a failed worker RPC must not turn into a hang
            self.client.finish_weight_update(weight_version=str(self.version))

        def shutdown(self) -> None:
            if self.sender is not None:
                self.sender.close()

    return {
        "GlooTrainerInitInfo": GlooTrainerInitInfo,
        "GlooTrainerWeightTransferEngine": GlooTrainerWeightTransferEngine,
    }


_LAZY: dict[str, type] = {}


def __getattr__(name: str):
    """Build the vLLM adapter classes on first access (keeps vLLM out of learner imports)."""
    if name in ("GlooTrainerInitInfo", "GlooTrainerWeightTransferEngine"):
        if not _LAZY:
            _LAZY.update(_build_vllm_trainer_engine())
        return _LAZY[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
