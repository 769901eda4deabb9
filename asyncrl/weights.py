"""Wire protocol for streaming weights from the learner to the actors over gloo.

Torch-only (no vLLM import), shared by the sender (``learner/weight_sender.py``) and the
receiver inside vLLM's worker (``actors/weight_transfer.py``), so both ends use one
definition of the format.

Group: rank 0 is the sender (learner rank 0), ranks ``1..world_size-1`` are receivers (vLLM
workers). It is a private ``ProcessGroupGloo`` over its own ``TCPStore``; the default process
group (the learner's FSDP group, vLLM's own group) is never touched, and every collective
carries the group's deadline, so a dead or absent peer raises instead of hanging.

One sync of version ``v``, all broadcasts from rank 0::

    per bucket:  header int64[8] = [MAGIC, BUCKET, v, meta_len, data_len, crc32, 0, 0]
                 payload uint8[meta_len + data_len] = JSON metadata | packed tensor bytes
    trailer:     header int64[8] = [MAGIC, END, v, n_tensors, total_bytes, n_buckets, 0, 0]
    ack:         all-reduce(MAX) int64[1]: 0 if every receiver verified and loaded, else 1

Metadata is JSON (names, dtypes, shapes, byte offsets), never pickle. A tensor's bytes start
at a multiple of ``ALIGN`` so the receiver can view them in place. Each bucket's CRC32 is
checked before its tensors are handed to the model, and the trailer's tensor, byte and bucket
counts are checked at the end (nothing lost or left over). A receiver that fails keeps draining the stream (so the
group stays in lockstep), reports 1 in the ack and raises; the sender raises too.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from asyncrl.torchrun import listen_fd

MAGIC = 0x61737972  # "asyr": rejects a stream that is not ours (or is misaligned)
KIND_BUCKET, KIND_END = 1, 2
HEADER_LEN = 8
ALIGN = 16  # bytes; keeps every tensor view aligned for any dtype
DEFAULT_BUCKET_BYTES = 64 << 20
DEFAULT_TIMEOUT_S = 120.0
LOOPBACK = "127.0.0.1"

LoadFn = Callable[[list[tuple[str, torch.Tensor]]], object]


class WeightSyncError(RuntimeError):
    """A weight sync failed: timeout, dead peer, version or checksum mismatch, load error."""


@dataclass(frozen=True)
class SyncStats:
    """What one sync moved: ``bytes`` of tensor data, ``tensors`` count, ``seconds`` wall."""

    bytes: int
    tensors: int
    seconds: float


class GlooGroup:
    """A private gloo process group (rank 0 = sender) with a deadline on every collective."""

    def __init__(self, address: str, port: int, rank: int, world_size: int, timeout_s: float,
                 local_address: str = "", bind: str = "") -> None:  # fmt: skip
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
            bound = {"master_listen_fd": listen_fd(bind or address, port)} if rank == 0 else {}
            self._store = dist.TCPStore(
                address,
                port,
                world_size,
                rank == 0,
                timeout=self.timeout,
                wait_for_workers=True,
                **bound,
            )
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = self.timeout
            opts._devices = [_gloo_device(local_address or address)]
            prefix = dist.PrefixStore("asyncrl/weights", self._store)
            self._pg = dist.ProcessGroupGloo(prefix, rank, world_size, opts)
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

    def all_max(self, value: int) -> int:
        """All-reduce MAX of one int over the group."""
        t = torch.tensor([value], dtype=torch.int64)
        opts = dist.AllreduceOptions()
        opts.reduceOp, opts.timeout = dist.ReduceOp.MAX, self.timeout
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


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise WeightSyncError(f"unknown dtype {name!r} in weight metadata")
    return dtype


def plan_buckets(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group tensors, in order, into buckets of at most ``bucket_bytes`` (aligned) bytes.

    Lazy, so a learner that materializes tensors one at a time never holds more than one
    bucket. A tensor larger than ``bucket_bytes`` travels alone in its own bucket.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        n = _align(tensor.numel() * tensor.element_size())
        if bucket and size + n > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += n
    if bucket:
        yield bucket


def pack_bucket(bucket: list[tuple[str, torch.Tensor]]) -> tuple[bytes, torch.Tensor]:
    """Return (JSON metadata, uint8 data) for one bucket; offsets and ``len(meta)`` are
    multiples of ``ALIGN``."""
    names, dtypes, shapes, offsets = [], [], [], []
    off = 0
    for name, t in bucket:
        names.append(name)
        dtypes.append(str(t.dtype).removeprefix("torch."))
        shapes.append(list(t.shape))
        offsets.append(off)
        off += _align(t.numel() * t.element_size())
    data = torch.zeros(off, dtype=torch.uint8)
    for (_, t), start in zip(bucket, offsets, strict=True):
        raw = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        data[start : start + raw.numel()].copy_(raw)
    meta = json.dumps(
        {"names": names, "dtypes": dtypes, "shapes": shapes, "offsets": offsets},
        separators=(",", ":"),
    ).encode()
    # Pad with JSON whitespace so the data that follows it in the payload stays aligned.
    return meta.ljust(_align(len(meta)), b" "), data


def unpack_bucket(meta: bytes, data: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Inverse of ``pack_bucket``: views into ``data`` (so ``data`` must not be reused)."""
    m = json.loads(meta)
    out = []
    fields = (m["names"], m["dtypes"], m["shapes"], m["offsets"])
    for name, dt, shape, off in zip(*fields, strict=True):
        dtype = _dtype(dt)
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * dtype.itemsize
        if off + nbytes > data.numel():
            raise WeightSyncError(f"tensor {name!r} runs past its bucket ({off}+{nbytes})")
        out.append((name, data[off : off + nbytes].view(dtype).reshape(shape)))
    return out


def crc32(data: torch.Tensor, start: int = 0) -> int:
    """CRC32 of a contiguous uint8 CPU tensor, continuing from ``start``."""
    return zlib.crc32(memoryview(data.numpy()), start)


def _header(kind: int, version: int, a: int, b: int, c: int) -> torch.Tensor:
    return torch.tensor([MAGIC, kind, version, a, b, c, 0, 0], dtype=torch.int64)


def send_stream(
    group: GlooGroup,
    named: Iterable[tuple[str, torch.Tensor]],
    version: int,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> tuple[int, int]:
    """Sender side of one sync. Returns ``(total_bytes, n_tensors)``.

    Raises WeightSyncError when a receiver rejected the sync or a peer died / timed out.
    """
    total, count, buckets = 0, 0, 0
    for bucket in plan_buckets(named, bucket_bytes):
        meta, data = pack_bucket(bucket)
        payload = torch.cat([torch.frombuffer(bytearray(meta), dtype=torch.uint8), data])
        group.broadcast(_header(KIND_BUCKET, version, len(meta), data.numel(), crc32(data)))
        group.broadcast(payload)
        total += data.numel()
        count += len(bucket)
        buckets += 1
    group.broadcast(_header(KIND_END, version, count, total, buckets))
    if group.all_max(0) != 0:
        raise WeightSyncError(f"a receiver rejected weight sync version {version}")
    return total, count


def receive_stream(group: GlooGroup, expected_version: int, load: LoadFn) -> tuple[int, int]:
    """Receiver side of one sync: verify each bucket, hand its tensors to ``load``.

    ``load`` gets ``[(name, tensor)]`` views into a fresh buffer per bucket (vLLM's layerwise
    reload keeps references until a layer is complete, so buffers are never reused).
    Returns ``(total_bytes, n_tensors)``; raises WeightSyncError on any failure, after
    draining the stream and reporting the failure to the sender.
    """
    error: Exception | None = None
    total, count, buckets = 0, 0, 0
    while True:
        header = torch.zeros(HEADER_LEN, dtype=torch.int64)
        group.broadcast(header)
        magic, kind, version, a, b, c = (int(x) for x in header[:6])
        if (
            magic != MAGIC
            or kind not in (KIND_BUCKET, KIND_END)
            or (kind == KIND_BUCKET and a % ALIGN)
        ):
            # The stream itself is unreadable: we cannot stay in lockstep, so stop here.
            raise WeightSyncError(f"bad weight-stream header {header.tolist()}")
        if version != expected_version and error is None:
            error = WeightSyncError(f"got weight version {version}, expected {expected_version}")
        if kind == KIND_END:
            if error is None and (a, b, c) != (count, total, buckets):
                error = WeightSyncError(
                    f"weight sync {version} incomplete: got {count} tensors / {total} bytes "
                    f"/ {buckets} buckets, sender sent {a} / {b} / {c}"
                )
            break
        payload = torch.empty(a + b, dtype=torch.uint8)
        group.broadcast(payload)
        data = payload[a:]
        total += b
        buckets += 1
        if error is not None:
            continue  # drain only
        try:
            if crc32(data) != c:
                raise WeightSyncError(f"bucket checksum mismatch in weight sync {version}")
            tensors = unpack_bucket(payload[:a].numpy().tobytes(), data)
            count += len(tensors)
            load(tensors)
        except Exception as e:  # keep draining so the sender and other receivers finish
            error = e
    if group.all_max(1 if error else 0) != 0 and error is None:
        error = WeightSyncError(f"another receiver rejected weight sync {expected_version}")
    if error is not None:
        if isinstance(error, WeightSyncError):
            raise error
        raise WeightSyncError(f"loading weight sync {expected_version} failed: {error}") from error
    return total, count
