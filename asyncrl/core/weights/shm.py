"""The shm transport: buckets through shared memory, for actors on the learner's host.

The default for a CPU learner whose network is loopback (``asyncrl run``: every role on one
host). Each bucket is packed straight into a fresh file in ``/dev/shm`` (tmpfs); receivers
map that file and read it in place, so a bucket's bytes are written once by the sender and
read by each receiver, with no socket copies. Headers, the version label, checksums and the
ack are those of the gloo stream (``asyncrl.core.weights.stream``), sent over a private gloo group on
loopback; only the payload takes the shared-memory path.

Files: one directory per group, ``/dev/shm/asyncrl-weights-<pid>-<random>`` (mode 0700, files
0600); bucket ``i`` of every sync is file ``i``. Within a sync a file is written once and
never again, so receivers may keep views of it until the sync ends (vLLM's layerwise reload
keeps them until a layer is complete); the next sync rewrites the files in place (warm
pages, no page faults: the sender's pack is one copy). The group's files hold about one
model in /dev/shm while the group lives, reserved with ``posix_fallocate`` (a full /dev/shm
is a clear error, not a SIGBUS); ``close`` removes them, and a directory whose creating
process is gone (a SIGKILLed learner) is removed by the next sender that opens a group.

Deferred syncs (``send(..., wait_ack=False)``, the learner's default, ``learner.defer_weight_ack``):
``send`` packs every bucket into its file and returns (the files are the snapshot: the
learner may train on at once), and ``collect_ack``, run by the learner in a thread, sends the
headers (a gloo broadcast returns only once every receiver joined it, so this is where the
actors' pause is waited for) and collects the ack. The next ``send`` waits for that first.

A receiver on another host cannot see the directory: ``join`` fails naming
``learner.weight_transport=gloo``. Receivers must run as the learner's user (the files are
0600); the directory's random name reaches them only over the control plane.
"""

from __future__ import annotations

import mmap
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from asyncrl.core.weights.base import SendStats, cast, timed_send
from asyncrl.core.weights.gloo import GlooGroup, GlooSender
from asyncrl.core.weights.stream import (
    DEFAULT_TIMEOUT_S,
    LoadFn,
    WeightSyncError,
    announce_stream,
    receive_stream,
    stage_stream,
)

if TYPE_CHECKING:
    from asyncrl.core.config.network import NetworkConfig

PREFIX = "asyncrl-weights-"
TOKEN_FILE = "token"


def shm_root() -> str:
    """``/dev/shm`` (tmpfs) where it exists, else the temp directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


class ShmGroup:
    """A ``Collective`` whose payloads are files in ``directory``; everything else is the
    gloo ``group``'s. Every rank counts a sync's payloads, so its bucket ``i`` is file ``i``
    on all ranks (``restart`` at each sync)."""

    device = torch.device("cpu")

    def __init__(self, group: GlooGroup, directory: str) -> None:
        self.group, self.directory, self.rank = group, Path(directory), group.rank
        self._next = 0
        self._segments: dict[int, torch.Tensor] = {}  # sender: file i, mapped and warm

    def broadcast(self, tensor: torch.Tensor) -> None:
        self.group.broadcast(tensor)

    def all_max(self, value: int) -> int:
        return self.group.all_max(value)

    checksum = staticmethod(GlooGroup.checksum)

    def restart(self) -> None:
        """A new sync begins: its first bucket is file 0 again."""
        self._next = 0

    def new_payload(self, nbytes: int) -> torch.Tensor:
        """File ``i``, reused from the last sync when it is large enough: its pages are
        already allocated and mapped, so packing into it costs one copy, no page faults."""
        i = self._take()
        segment = self._segments.get(i)
        if segment is None or segment.numel() < nbytes:
            segment = self._segments[i] = _allocate(self.directory / str(i), nbytes)
        return segment[:nbytes]

    def send_payload(self, payload: torch.Tensor) -> None:
        """Nothing to move: the bytes are in the file, which receivers open after the header."""

    def recv_payload(self, nbytes: int) -> torch.Tensor:
        """File ``i`` mapped afresh (private: this rank's writes, if any, stay its own)."""
        path = self.directory / str(self._take())
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            raise WeightSyncError(f"shm weight bucket {path} cannot be opened: {e}") from e
        try:
            if os.fstat(fd).st_size < nbytes:
                raise WeightSyncError(f"shm weight bucket {path} is shorter than {nbytes} bytes")
            buf = mmap.mmap(fd, max(nbytes, 1), access=mmap.ACCESS_COPY)
        finally:
            os.close(fd)
        return torch.frombuffer(buf, dtype=torch.uint8)[:nbytes]

    def release(self) -> None:
        """The sync is over; its files stay for the next one (``close`` removes them)."""
        self.restart()

    def _take(self) -> int:
        i, self._next = self._next, self._next + 1
        return i

    def close(self) -> None:
        self._segments.clear()
        self.group.close()


def _allocate(path: Path, nbytes: int) -> torch.Tensor:
    """A file of ``nbytes`` whose blocks are reserved now (``posix_fallocate``: a full
    /dev/shm fails here with a clear error, not later with SIGBUS), mapped shared."""
    size = max(nbytes, 1)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
        buf = mmap.mmap(fd, size)
    except OSError as e:
        raise WeightSyncError(
            f"shm weight transport: cannot allocate {size / 1e6:.0f} MB in {path.parent} ({e}); "
            "free space in /dev/shm (a container may need a larger --shm-size) or set "
            "learner.weight_transport=gloo"
        ) from e
    finally:
        os.close(fd)
    return torch.frombuffer(buf, dtype=torch.uint8)


class ShmSender(GlooSender):
    """Learner rank 0's end of the shm transport (``transports.base.Sender``)."""

    name: ClassVar[str] = "shm"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._dir: str | None = None
        self._shm: ShmGroup | None = None
        self._staged: list | None = None  # send(wait_ack=False)'s messages, for collect_ack

    def open(self, world_size: int, network: NetworkConfig) -> dict[str, Any]:
        info = super().open(world_size, network)
        remove_orphans()
        self._dir = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=shm_root())
        token = secrets.token_hex(16)
        (Path(self._dir) / TOKEN_FILE).write_text(token)
        return {**info, "transport": self.name, "shm_dir": self._dir, "shm_token": token}

    def connect(self) -> None:
        super().connect()
        assert self._group is not None and self._dir is not None
        self._shm = ShmGroup(self._group, self._dir)

    def send(
        self, named: Iterable[tuple[str, torch.Tensor]], version: int, wait_ack: bool = True
    ) -> SendStats:
        """``wait_ack=False``: pack every bucket into its file (the snapshot) and return; the
        headers, which block until each receiver joins, and the ack go in ``collect_ack``
        (the learner runs it in a thread while it trains). The files are rewritten only by
        the next ``send``, after that."""
        if self._shm is None:
            raise WeightSyncError("ShmSender.send before connect")
        self._shm.restart()
        named = cast(named, self.wire_dtype, "cpu")
        if wait_ack:
            return timed_send(self._shm, named, version, self.bucket_bytes)
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        t0 = time.perf_counter()
        self._staged, nbytes, count = stage_stream(self._shm, named, version, self.bucket_bytes)
        return SendStats(bytes=nbytes, tensors=count, seconds=time.perf_counter() - t0)

    def collect_ack(self, version: int) -> None:
        shm, staged, self._staged = self._shm, self._staged, None
        if shm is None:
            raise WeightSyncError(f"weight sync {version}: the group closed before its ack")
        if staged is None:
            raise WeightSyncError(f"weight sync {version}: nothing was staged")
        with self._acking(version):  # shm.group: a close meanwhile only detaches it
            announce_stream(shm, staged, version)

    def close(self) -> None:
        self._shm, self._staged = None, None
        super().close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class ShmReceiver:
    """A receiver's end of the shm transport (``transports.base.Receiver``)."""

    def __init__(self) -> None:
        self.group: ShmGroup | None = None

    def join(self, info: dict[str, Any], rank: int, device: torch.device | None = None) -> None:
        self.close()
        directory = info.get("shm_dir", "")
        _check_same_host(directory, info.get("shm_token", ""))
        gloo = GlooGroup(
            info["master_address"],
            info["master_port"],
            rank,
            info["world_size"],
            info.get("timeout_s", DEFAULT_TIMEOUT_S),
            local_address=info.get("local_address", ""),
        )
        self.group = ShmGroup(gloo, directory)

    def receive(self, version: int, load: LoadFn) -> tuple[int, int]:
        if self.group is None:
            raise WeightSyncError("weight receive before joining a group")
        self.group.restart()
        return receive_stream(self.group, version, load)

    def close(self) -> None:
        if self.group is not None:
            self.group.group.close()
            self.group = None


def _check_same_host(directory: str, token: str) -> None:
    """The sender's directory, with its token: this receiver shares the learner's memory."""
    try:
        ok = bool(token) and (Path(directory) / TOKEN_FILE).read_text() == token
    except OSError:
        ok = False
    if not ok:
        raise WeightSyncError(
            f"shm weight transport: {directory or '(none)'} is not readable here with the "
            "learner's token, so this actor is not on the learner's host (or runs as another "
            "user); set learner.weight_transport=gloo"
        )


def remove_orphans(root: str | None = None) -> list[str]:
    """Remove this user's ``asyncrl-weights-<pid>-*`` directories whose process is gone;
    returns their paths."""
    removed = []
    for entry in Path(root or shm_root()).glob(f"{PREFIX}*"):
        pid = entry.name.removeprefix(PREFIX).split("-")[0]
        if not pid.isdigit() or _alive(int(pid)) or entry.stat().st_uid != os.getuid():
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(str(entry))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
