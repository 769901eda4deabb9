"""A fake NCCL for unit tests of the nccl transport's control flow (no GPU here).

Ranks are threads of one process. Like NCCL, a collective call only *posts* work and returns
at once; the work completes when every rank of the group has posted its matching call (the
k-th collective of each rank), and a fence tells a rank whether its posted work is done.
A rank that never posts (a dead peer) leaves the others' work pending forever; ``destroy``
(ncclCommAbort) makes that rank's later calls fail. ``corrupt`` flips one byte of the next
large broadcast as the receivers get it (a damaged transfer).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

JOIN_WAIT_S = (
    30.0  # a rendezvous missing a rank gives up after this (the test's deadline is shorter)
)


@dataclass
class _Round:
    kind: str
    tensors: dict[int, torch.Tensor] = field(default_factory=dict)
    outs: dict[int, torch.Tensor] = field(default_factory=dict)
    done: bool = False


class _Group:
    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.joined: set[int] = set()
        self.rounds: list[_Round] = []


class FakeNccl:
    """One fake NCCL 'network': ``factory`` is a ``transports.nccl.CommFactory``, ``fence`` a
    ``transports.nccl.Fence``; ``unique_id`` mints ids."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.groups: dict[bytes, _Group] = {}
        self.comms: list[FakeComm] = []
        self.corrupt = False
        self._ids = 0

    def unique_id(self) -> bytes:
        with self.cond:
            self._ids += 1
            return self._ids.to_bytes(128, "big")

    def factory(self, uid: bytes, rank: int, world_size: int, device) -> FakeComm:
        with self.cond:
            group = self.groups.setdefault(uid, _Group(world_size))
            group.joined.add(rank)
            self.cond.notify_all()
            if not self.cond.wait_for(lambda: len(group.joined) == world_size, JOIN_WAIT_S):
                raise RuntimeError("fake NCCL rendezvous: a rank never came")
            comm = FakeComm(self, group, rank)
            self.comms.append(comm)
            return comm

    @staticmethod
    def fence(comm: FakeComm, device) -> _Fence:
        return _Fence(comm, comm.posted if comm is not None else 0)


class _Fence:
    def __init__(self, comm: FakeComm, upto: int) -> None:
        self.comm, self.upto = comm, upto

    def query(self) -> bool:
        rounds = self.comm.group.rounds
        with self.comm.net.cond:
            return all(r.done for r in rounds[: self.upto])


class FakeComm:
    def __init__(self, net: FakeNccl, group: _Group, rank: int) -> None:
        self.net, self.group, self.rank = net, group, rank
        self.posted = 0
        self.aborted = False

    def broadcast(self, tensor: torch.Tensor, src: int, stream=None) -> None:
        self._post("broadcast", tensor, tensor)

    def all_reduce(self, in_tensor, out_tensor=None, op=None, stream=None) -> torch.Tensor:
        out = in_tensor.clone() if out_tensor is None else out_tensor
        self._post("all_reduce", in_tensor, out)
        return out

    def destroy(self) -> None:
        self.aborted = True

    def _post(self, kind: str, tensor: torch.Tensor, out: torch.Tensor) -> None:
        if self.aborted:
            raise RuntimeError("NCCL communicator aborted")
        with self.net.cond:
            rounds = self.group.rounds
            while len(rounds) <= self.posted:
                rounds.append(_Round(kind))
            r = rounds[self.posted]
            if r.kind != kind:
                raise RuntimeError(f"fake NCCL: rank {self.rank} posted {kind}, others {r.kind}")
            r.tensors[self.rank], r.outs[self.rank] = tensor, out
            self.posted += 1
            if len(r.tensors) == self.group.world_size:
                self._complete(r)

    def _complete(self, r: _Round) -> None:
        if r.kind == "broadcast":
            src = r.tensors[0]
            for rank, t in r.tensors.items():
                if rank != 0:
                    t.copy_(src)
                    if self.net.corrupt and t.numel() > 64:
                        t[-1] ^= 1
            if self.net.corrupt and src.numel() > 64:
                self.net.corrupt = False
        else:
            result = torch.stack([t for t in r.tensors.values()]).amax(dim=0)
            for out in r.outs.values():
                out.copy_(result)
        r.done = True
