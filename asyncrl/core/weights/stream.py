"""The weight stream: one format for every transport (asyncrl/core/weights/).

Torch-only (no vLLM import), shared by the sender (learner rank 0) and the receivers (the
actors' engines), so both ends use one definition of the format. A transport supplies the
``Collective`` (gloo on host memory, NCCL on GPU memory); the stream does the rest.

Group: rank 0 is the sender (learner rank 0), ranks ``1..world_size-1`` are receivers (vLLM
workers). Every collective carries the group's deadline, so a dead or absent peer raises
``WeightSyncError`` instead of hanging.

One sync of version ``v``, all broadcasts from rank 0, every tensor on ``group.device``::

    per bucket:  header int64[8] = [MAGIC, BUCKET, v, meta_len, data_len, checksum, 0, 0]
                 payload uint8[meta_len + data_len] = JSON metadata | packed tensor bytes
    trailer:     header int64[8] = [MAGIC, END, v, n_tensors, total_bytes, n_buckets, 0, 0]
    ack:         all-reduce(MAX) int64[1]: 0 if every receiver verified and loaded, else 1

Metadata is JSON (names, dtypes, shapes, byte offsets), never pickle. A tensor's bytes start
at a multiple of ``ALIGN`` so the receiver can view them in place. Each bucket's checksum
(``group.checksum``: ``host_checksum`` (XXH3) on the host, ``device_checksum`` on a GPU) is checked before its
tensors are handed to the model, and the trailer's tensor, byte and bucket
counts are checked at the end (nothing lost or left over). A receiver that fails keeps draining the stream (so the
group stays in lockstep), reports 1 in the ack and raises; the sender raises too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

import torch
import xxhash

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


class Collective(Protocol):
    """What the stream needs of a transport's group: rank 0 is the sender.

    Invariant: each call returns only once the collective completed on this rank, or raises
    ``WeightSyncError`` within the group's deadline (a dead peer, an abort)."""

    rank: int
    device: torch.device
    """Where the stream's tensors live: the host for gloo, this rank's GPU for NCCL."""

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast ``tensor`` (on ``device``) in place from rank 0."""
        ...

    def all_max(self, value: int) -> int:
        """All-reduce MAX of one int over the group."""
        ...

    def checksum(self, data: torch.Tensor) -> int:
        """A checksum of a contiguous uint8 tensor on ``device`` (the same on every rank)."""
        ...

    def new_payload(self, nbytes: int) -> torch.Tensor:
        """Sender: a writable uint8 buffer for the next bucket (where it is sent from)."""
        ...

    def send_payload(self, payload: torch.Tensor) -> None:
        """Sender: move a bucket from ``new_payload``'s buffer to every receiver."""
        ...

    def recv_payload(self, nbytes: int) -> torch.Tensor:
        """Receiver: the next bucket, ``nbytes`` uint8, never reused by the group (``load``
        may keep views of it)."""
        ...

    def release(self) -> None:
        """Sender: the sync is over (acknowledged or failed); drop what its buckets hold."""
        ...


class BroadcastPayloads:
    """Buckets that travel as one broadcast each: the payload methods of a ``Collective``
    whose ``broadcast`` moves the bytes (gloo, NCCL)."""

    device: torch.device

    def broadcast(self, tensor: torch.Tensor) -> None: ...

    def new_payload(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def send_payload(self, payload: torch.Tensor) -> None:
        self.broadcast(payload)

    def recv_payload(self, nbytes: int) -> torch.Tensor:
        payload = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        self.broadcast(payload)
        return payload

    def release(self) -> None:
        pass


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


def bucket_meta(bucket: list[tuple[str, torch.Tensor]]) -> tuple[bytes, list[int], int]:
    """(JSON metadata padded to ``ALIGN``, each tensor's byte offset, data bytes) of a bucket."""
    names, dtypes, shapes, offsets = [], [], [], []
    off = 0
    for name, t in bucket:
        names.append(name)
        dtypes.append(str(t.dtype).removeprefix("torch."))
        shapes.append(list(t.shape))
        offsets.append(off)
        off += _align(t.numel() * t.element_size())
    meta = json.dumps(
        {"names": names, "dtypes": dtypes, "shapes": shapes, "offsets": offsets},
        separators=(",", ":"),
    ).encode()
    # Pad with JSON whitespace so the data that follows it in the payload stays aligned.
    return meta.ljust(_align(len(meta)), b" "), offsets, off


def pack_into(
    data: torch.Tensor, bucket: list[tuple[str, torch.Tensor]], offsets: list[int]
) -> None:
    """Copy each tensor's bytes once into ``data`` (uint8, on its device) at its offset, and
    zero the padding after it (never leak stale memory, keep checksums deterministic)."""
    for (_, t), start in zip(bucket, offsets, strict=True):
        raw = t.detach().to(data.device).contiguous().reshape(-1).view(torch.uint8)
        end = start + raw.numel()
        data[start:end].copy_(raw)
        data[end : _align(end)].zero_()


def pack_bucket(
    bucket: list[tuple[str, torch.Tensor]], device: torch.device | str = "cpu"
) -> tuple[bytes, torch.Tensor]:
    """Return (JSON metadata, uint8 data on ``device``) for one bucket; offsets and
    ``len(meta)`` are multiples of ``ALIGN``. Tensors on ``device`` are copied once, in
    place into the bucket (no host round trip on a GPU)."""
    meta, offsets, size = bucket_meta(bucket)
    data = torch.empty(size, dtype=torch.uint8, device=device)
    pack_into(data, bucket, offsets)
    return meta, data


def pack_payload(
    bucket: list[tuple[str, torch.Tensor]], new_payload: Callable[[int], torch.Tensor]
) -> tuple[int, torch.Tensor]:
    """``(meta_len, payload)``: the metadata and the data in one uint8 buffer from
    ``new_payload(nbytes)``, each byte written once (what a bucket's send moves)."""
    meta, offsets, size = bucket_meta(bucket)
    payload = new_payload(len(meta) + size)
    payload[: len(meta)].copy_(torch.frombuffer(bytearray(meta), dtype=torch.uint8))
    pack_into(payload[len(meta) :], bucket, offsets)
    return len(meta), payload


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


def host_checksum(data: torch.Tensor) -> int:
    """XXH3-64 of a contiguous uint8 CPU tensor, as a signed int64 (the header's slot). About
    6x faster than zlib's CRC32 here (17.8 vs 2.8 GB/s on 256 MB), and it detects changes as
    well: a checksum against damage, not a signature."""
    # an ndarray is a buffer; numpy's stubs declare its __buffer__ for Python >= 3.12 only
    value = xxhash.xxh3_64_intdigest(memoryview(data.numpy()))  # type: ignore[arg-type]
    return value - (1 << 64) if value >= 1 << 63 else value


_MASK64, _GOLDEN = (1 << 64) - 1, 0x9E3779B97F4A7C15
_CHECKSUM_CHUNK = 1 << 22  # int32 words per step: bounds the int64 temporaries (32 MiB each)
_weights_cache: dict[torch.device, torch.Tensor] = {}


def device_checksum(data: torch.Tensor) -> int:
    """A position-sensitive checksum of a uint8 tensor, computed where it lives (a GPU: no
    host copy). ``data.numel()`` must be a multiple of 4 (stream buckets are ``ALIGN``ed).

    Over the int32 words ``w[i]``: ``s1 = sum w[i]`` and ``s2 = sum w[i] * (i + 1)``, both
    mod 2**64 (int64 arithmetic wraps, and modular sums do not depend on the reduction
    order, so the sender's GPU and the receiver's agree exactly). Any change to one word
    changes ``s1``; swapped words change ``s2``. Returned as one signed int64.
    """
    if data.numel() % 4:
        raise ValueError(f"device_checksum needs a multiple of 4 bytes, got {data.numel()}")
    words = data.view(torch.int32)
    weights = _weights_cache.get(data.device)
    if weights is None:
        weights = torch.arange(1, _CHECKSUM_CHUNK + 1, dtype=torch.int64, device=data.device)
        _weights_cache[data.device] = weights
    s1 = torch.zeros((), dtype=torch.int64, device=data.device)
    s2 = torch.zeros((), dtype=torch.int64, device=data.device)
    for start in range(0, words.numel(), _CHECKSUM_CHUNK):
        chunk = words[start : start + _CHECKSUM_CHUNK].to(torch.int64)
        part = chunk.sum()
        s1 += part
        s2 += (chunk * weights[: chunk.numel()]).sum() + part * start
    mixed = (int(s1.item()) * _GOLDEN + int(s2.item())) & _MASK64
    return mixed - (1 << 64) if mixed >= 1 << 63 else mixed


def _header(
    kind: int, version: int, a: int, b: int, c: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    return torch.tensor([MAGIC, kind, version, a, b, c, 0, 0], dtype=torch.int64, device=device)


Message = tuple[torch.Tensor, torch.Tensor | None]
"""(header, payload) of one bucket, or (trailer header, None)."""


class _Tally:
    """What ``_messages`` produced so far: data bytes and tensors."""

    total = count = 0


def _messages(
    group: Collective,
    named: Iterable[tuple[str, torch.Tensor]],
    version: int,
    bucket_bytes: int,
    tally: _Tally,
) -> Iterator[Message]:
    """Each bucket packed into its ``group.new_payload`` buffer and checksummed, with its
    header, then the trailer; lazily, one bucket at a time (``tally`` counts as it goes)."""
    dev, buckets = group.device, 0
    for bucket in plan_buckets(named, bucket_bytes):
        meta_len, payload = pack_payload(bucket, group.new_payload)
        data = payload[meta_len:]
        checksum = group.checksum(data)
        yield _header(KIND_BUCKET, version, meta_len, data.numel(), checksum, dev), payload
        tally.total += data.numel()
        tally.count += len(bucket)
        buckets += 1
    yield _header(KIND_END, version, tally.count, tally.total, buckets, dev), None


def send_stream(
    group: Collective,
    named: Iterable[tuple[str, torch.Tensor]],
    version: int,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    wait_ack: bool = True,
) -> tuple[int, int]:
    """Sender side of one sync, one bucket held at a time. Returns ``(total_bytes,
    n_tensors)``.

    Raises WeightSyncError when a receiver rejected the sync or a peer died / timed out.
    ``wait_ack=False`` returns once the trailer is sent, before the receivers verified and
    loaded the version: the caller then runs ``collect_ack(group, version)`` (in one thread,
    before the group's next collective), which raises instead.
    """
    tally = _Tally()
    announce_stream(group, _messages(group, named, version, bucket_bytes, tally), version, wait_ack)
    return tally.total, tally.count


def stage_stream(
    group: Collective,
    named: Iterable[tuple[str, torch.Tensor]],
    version: int,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> tuple[list[Message], int, int]:
    """The sender's half of a sync that needs no receiver: every bucket packed and
    checksummed, with its header, and the trailer. Returns ``(messages, total_bytes,
    n_tensors)``; ``announce_stream`` sends them later (from another thread), so the tensors
    may change as soon as this returns. Holds every bucket at once: for a transport whose
    payloads stay put anyway (shm's files)."""
    tally = _Tally()
    messages = list(_messages(group, named, version, bucket_bytes, tally))
    return messages, tally.total, tally.count


def announce_stream(
    group: Collective, messages: Iterable[Message], version: int, wait_ack: bool = True
) -> None:
    """Send ``messages`` (``_messages``, lazy or staged) in order, then the ack
    (``collect_ack``; not with ``wait_ack=False``). Raises WeightSyncError when a peer died
    or timed out, or a receiver rejected the sync."""
    try:
        for header, payload in messages:
            group.broadcast(header)
            if payload is not None:
                group.send_payload(payload)
    except BaseException:
        group.release()
        raise
    if wait_ack:
        collect_ack(group, version)


def collect_ack(group: Collective, version: int) -> None:
    """The end of a sync on the sender: the receivers' ack (every one verified and loaded
    ``version``), then the payloads are released. Raises WeightSyncError if one rejected."""
    try:
        if group.all_max(0) != 0:
            raise WeightSyncError(f"a receiver rejected weight sync version {version}")
    finally:
        group.release()


def receive_stream(group: Collective, expected_version: int, load: LoadFn) -> tuple[int, int]:
    """Receiver side of one sync: verify each bucket, hand its tensors to ``load``.

    ``load`` gets ``[(name, tensor)]`` views (on ``group.device``) into a fresh buffer per
    bucket (vLLM's layerwise
    reload keeps references until a layer is complete, so buffers are never reused).
    Returns ``(total_bytes, n_tensors)``; raises WeightSyncError on any failure, after
    draining the stream and reporting the failure to the sender.
    """
    error: Exception | None = None
    total, count, buckets = 0, 0, 0
    while True:
        header = torch.zeros(HEADER_LEN, dtype=torch.int64, device=group.device)
        group.broadcast(header)
        magic, kind, version, a, b, c = header[:6].tolist()
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
        payload = group.recv_payload(a + b)
        data = payload[a:]
        total += b
        buckets += 1
        if error is not None:
            continue  # drain only
        try:
            if group.checksum(data) != c:
                raise WeightSyncError(f"bucket checksum mismatch in weight sync {version}")
            tensors = unpack_bucket(payload[:a].cpu().numpy().tobytes(), data)
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
