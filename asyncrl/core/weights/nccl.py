"""The NCCL transport: GPU memory to GPU memory, learner rank 0 broadcasting to every worker.

The default for GPU learners (``learner.weight_transport=auto``). The sender packs each
bucket on its GPU straight from the gathered full tensors (no host copy, no full copy of the
model anywhere: one bucket at a time) and broadcasts it; receivers unpack views on their GPU
and hand them to vLLM's ``load_weights``. The stream format, its version label and its
per-bucket checksums are those of the gloo transport (``asyncrl.core.weights.stream``); the checksum is
``device_checksum``, computed on the GPU on both ends.

NCCL comes from vLLM (``PyNcclCommunicator``, its ctypes binding of the NCCL library vLLM
ships with), joined through the *unique-id* rendezvous: learner rank 0 mints an
``ncclUniqueId`` per group and sends it, base64 in JSON, over the CURVE-authenticated control
plane. vLLM's own ``nccl`` engine rendezvous instead goes through ``StatelessProcessGroup``,
which pickles objects through a TCPStore (``vllm/distributed/utils.py``), and carries no
version, no integrity check and no deadline; docs/architecture.md says why we did not use
it as is, and what was evaluated (``nccl_m2n``, ``ipc``).

Deadlines: NCCL calls only enqueue work on a CUDA stream. Every collective is followed by a
fence (a CUDA event) polled until ``timeout_s``; past it the communicator is aborted
(``ncclCommAbort``, which makes the pending kernels return) and ``WeightSyncError`` is
raised, so a dead peer never hangs the learner. The rendezvous (``ncclCommInitRank``) cannot
be cancelled: it runs on a daemon thread and the caller gets ``WeightSyncError`` at the
deadline; the abandoned thread ends when NCCL's bootstrap gives up, and the next group uses
a new unique id.

Verified on: CPU only, with a fake communicator (tests/unit/core/test_nccl_transport.py). Not
verified: two GPUs (the only GPU machine lent had one; NCCL refuses two ranks on one device).
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from asyncrl.core.weights.base import SendStats, cast, timed_send
from asyncrl.core.weights.stream import (
    DEFAULT_TIMEOUT_S,
    BroadcastPayloads,
    LoadFn,
    WeightSyncError,
    device_checksum,
    receive_stream,
)

if TYPE_CHECKING:
    from asyncrl.core.config.network import NetworkConfig

DEFAULT_NCCL_BUCKET_BYTES = 256 << 20
UNIQUE_ID_BYTES = 128


class Comm(Protocol):
    """The part of vLLM's ``PyNcclCommunicator`` this transport uses."""

    def broadcast(self, tensor: torch.Tensor, src: int, stream: Any = None) -> None: ...

    def all_reduce(
        self, in_tensor: torch.Tensor, out_tensor: Any = None, op: Any = None, stream: Any = None
    ) -> torch.Tensor: ...

    def destroy(self) -> None:
        """Abort the communicator (pending collectives return)."""
        ...


CommFactory = Callable[[bytes, int, int, torch.device], Comm]
"""``(unique_id, rank, world_size, device) -> Comm``; blocks until every rank joined."""
Fence = Callable[[Comm, torch.device], Any]
"""``(comm, device) -> object with .query() -> bool``: True once the work this rank enqueued
so far is done."""


def vllm_comm(unique_id: bytes, rank: int, world_size: int, device: torch.device) -> Comm:
    """vLLM's NCCL communicator, joined from a pre-shared unique id (no store, no pickle)."""
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator

    return PyNcclCommunicator.from_unique_id_bytes(unique_id, rank, world_size, device)


def vllm_unique_id() -> bytes:
    """A fresh ``ncclUniqueId`` (it names rank 0's bootstrap address and a random magic)."""
    from vllm.distributed.device_communicators.pynccl_wrapper import NCCLLibrary

    return bytes(NCCLLibrary().ncclGetUniqueId().internal)


def cuda_fence(comm: Comm, device: torch.device):
    """A CUDA event recorded on the current stream of ``device`` (where ``NcclGroup`` enqueues
    the communicator's kernels)."""
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


def _stream(device: torch.device):
    """The stream collectives run on: torch's current one. Passed explicitly, so vLLM's
    ``current_stream()`` (which installs a new current stream in a thread that never had one)
    is not called from the learner's training thread. None off CUDA (fake communicators)."""
    return torch.cuda.current_stream(device) if device.type == "cuda" else None


class NcclGroup(BroadcastPayloads):
    """An ``asyncrl.core.weights.stream.Collective`` over an NCCL communicator, with deadlines."""

    def __init__(
        self,
        comm: Comm,
        rank: int,
        device: torch.device,
        timeout_s: float,
        fence: Fence = cuda_fence,
    ) -> None:
        self.comm, self.rank, self.device = comm, rank, device
        self.timeout_s, self._fence = timeout_s, fence

    @classmethod
    def join(
        cls,
        unique_id: bytes,
        rank: int,
        world_size: int,
        device: torch.device,
        timeout_s: float,
        factory: CommFactory = vllm_comm,
        fence: Fence = cuda_fence,
    ) -> NcclGroup:
        """Form the group (every rank calls this with the same id), or raise WeightSyncError
        at ``timeout_s``."""
        comm = _within(
            timeout_s,
            f"NCCL weight group rendezvous (rank {rank}/{world_size})",
            lambda: factory(unique_id, rank, world_size, device),
        )
        if getattr(comm, "disabled", False):  # its collectives would silently do nothing
            raise WeightSyncError(
                "vLLM's NCCL communicator is disabled (VLLM_DISABLE_PYNCCL is set, or world "
                "size 1): unset VLLM_DISABLE_PYNCCL, or use learner.weight_transport=gloo"
            )
        return cls(comm, rank, device, timeout_s, fence)

    checksum = staticmethod(device_checksum)

    def broadcast(self, tensor: torch.Tensor) -> None:
        try:
            self.comm.broadcast(tensor, src=0, stream=_stream(self.device))
        except Exception as e:
            raise WeightSyncError(f"NCCL broadcast failed: {e}") from e
        self._wait("broadcast")

    def all_max(self, value: int) -> int:
        from torch.distributed import ReduceOp

        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        try:
            out = self.comm.all_reduce(t, op=ReduceOp.MAX, stream=_stream(self.device))
        except Exception as e:
            raise WeightSyncError(f"NCCL all-reduce failed: {e}") from e
        self._wait("all-reduce")
        return int(out.item())

    def _wait(self, what: str) -> None:
        """Poll a fence until the work enqueued so far is done; abort at the deadline."""
        fence = self._fence(self.comm, self.device)
        deadline, pause = time.monotonic() + self.timeout_s, 1e-4
        while not fence.query():
            if time.monotonic() > deadline:
                self.close()
                raise WeightSyncError(
                    f"NCCL {what} did not finish within {self.timeout_s:g}s (a dead or stuck "
                    "peer); the communicator was aborted"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def close(self) -> None:
        """Abort and drop the communicator (idempotent)."""
        comm, self.comm = self.comm, None  # type: ignore[assignment]  # no collective after close
        if comm is not None:
            comm.destroy()


def _within(timeout_s: float, what: str, fn: Callable[[], Comm]) -> Comm:
    """``fn()`` on a daemon thread; its result, or WeightSyncError at ``timeout_s`` (the thread
    is abandoned: NCCL's blocking init cannot be cancelled)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["comm"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["error"] = e

    thread = threading.Thread(target=run, name="nccl-rendezvous", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise WeightSyncError(f"{what} did not complete within {timeout_s:g}s")
    if "error" in out:
        raise WeightSyncError(f"{what} failed: {out['error']}") from out["error"]
    return out["comm"]


class NcclSender:
    """Learner rank 0's end of the NCCL transport (``transports.base.Sender``)."""

    name: ClassVar[str] = "nccl"

    def __init__(
        self,
        bucket_bytes: int = DEFAULT_NCCL_BUCKET_BYTES,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        wire_dtype: torch.dtype | None = None,
        device: torch.device | None = None,
        factory: CommFactory = vllm_comm,
        unique_id: Callable[[], bytes] = vllm_unique_id,
        fence: Fence = cuda_fence,
    ) -> None:
        """``device``: the learner's GPU (None = the current CUDA device at ``connect``);
        ``factory``, ``unique_id`` and ``fence`` are seams for tests (a fake communicator)."""
        if bucket_bytes <= 0 or timeout_s <= 0:
            raise ValueError(
                f"bucket_bytes ({bucket_bytes}) and timeout_s ({timeout_s}) must be positive"
            )
        self.bucket_bytes, self.timeout_s, self.wire_dtype = bucket_bytes, timeout_s, wire_dtype
        self.device = device
        self._factory, self._unique_id, self._fence = factory, unique_id, fence
        self._group: NcclGroup | None = None
        self._plan: tuple[bytes, int] | None = None

    def open(self, world_size: int, network: NetworkConfig) -> dict[str, Any]:
        """A new unique id. NCCL's bootstrap listens on the interface NCCL picks
        (``NCCL_SOCKET_IFNAME``, set to ``network.bind``'s interface off loopback,
        asyncrl/orchestration/launch/hostnet.py)."""
        self.close()
        uid = self._unique_id()
        if len(uid) != UNIQUE_ID_BYTES:
            raise WeightSyncError(f"NCCL unique id has {len(uid)} bytes, not {UNIQUE_ID_BYTES}")
        self._plan = (uid, world_size)
        return {
            "transport": self.name,
            "world_size": world_size,
            "timeout_s": self.timeout_s,
            "nccl_unique_id_b64": base64.b64encode(uid).decode(),
        }

    def connect(self) -> None:
        if self._plan is None:
            raise WeightSyncError("NcclSender.connect before open")
        uid, world = self._plan
        device = self.device or torch.device("cuda", torch.cuda.current_device())
        self._group = NcclGroup.join(
            uid, 0, world, device, self.timeout_s, self._factory, self._fence
        )

    @property
    def connected(self) -> bool:
        return self._group is not None

    def send(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> SendStats:
        if self._group is None:
            raise WeightSyncError("NcclSender.send before connect")
        group = self._group
        return timed_send(
            group, cast(named, self.wire_dtype, group.device), version, self.bucket_bytes
        )

    def close(self) -> None:
        group, self._group = self._group, None
        if group is not None:
            group.close()


class NcclReceiver:
    """A worker's end of the NCCL transport (``transports.base.Receiver``)."""

    def __init__(self, factory: CommFactory = vllm_comm, fence: Fence = cuda_fence) -> None:
        self._factory, self._fence = factory, fence
        self.group: NcclGroup | None = None

    def join(self, info: dict[str, Any], rank: int, device: torch.device | None = None) -> None:
        self.close()
        try:
            uid = base64.b64decode(info["nccl_unique_id_b64"], validate=True)
        except (KeyError, ValueError) as e:
            raise WeightSyncError(f"bad NCCL weights_init (no valid unique id): {e}") from e
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device())
        timeout_s = info.get("timeout_s", DEFAULT_TIMEOUT_S)
        self.group = NcclGroup.join(
            uid, rank, info["world_size"], device, timeout_s, self._factory, self._fence
        )

    def receive(self, version: int, load: LoadFn) -> tuple[int, int]:
        if self.group is None:
            raise WeightSyncError("weight receive before joining a group")
        return receive_stream(self.group, version, load)

    def close(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            group.close()
