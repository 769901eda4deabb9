"""The nccl transport's control flow with a fake NCCL (tests/unit/core/fake_nccl.py): versions,
integrity, deadlines, and the channel re-forming the group when a receiver dies. The real
NCCL path needs two GPUs (not verified here; asyncrl/core/weights/nccl.py says so)."""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from asyncrl.core.config.network import NetworkConfig
from asyncrl.core.weights import transports
from asyncrl.core.weights.nccl import NcclReceiver, NcclSender
from asyncrl.core.weights.stream import WeightSyncError, device_checksum
from asyncrl.learner.weights.channel import ActorWeightChannel, ChannelOptions
from tests.unit.core.fake_nccl import FakeNccl

CPU = torch.device("cpu")
TIMEOUT_S = 1.0


def model(seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        ("embed.weight", torch.randn(40, 16, generator=g)),
        ("layer.bias", torch.randn(3, generator=g)),  # 12 bytes: padded in the bucket
        ("layer.weight", torch.randn(16, 8, generator=g).bfloat16()),
        ("steps", torch.arange(5, dtype=torch.int64)),
    ]


def pair(net: FakeNccl, receivers: int = 1, bucket_bytes: int = 1 << 10):
    """A connected sender and ``receivers`` receivers over ``net``."""
    sender = NcclSender(bucket_bytes=bucket_bytes, timeout_s=TIMEOUT_S, device=CPU,
                        factory=net.factory, unique_id=net.unique_id, fence=net.fence)  # fmt: skip
    info = sender.open(1 + receivers, NetworkConfig())
    recvs = [NcclReceiver(factory=net.factory, fence=net.fence) for _ in range(receivers)]
    with ThreadPoolExecutor(receivers) as ex:
        joins = [ex.submit(r.join, info, 1 + i, CPU) for i, r in enumerate(recvs)]
        sender.connect()
        for j in joins:
            j.result()
    return sender, recvs


def both(send, recvs):
    """Run the send and the receives at once; each result, or the exception raised."""
    with ThreadPoolExecutor(1 + len(recvs)) as ex:
        futs = [ex.submit(send)] + [ex.submit(r) for r in recvs]
    return [f.exception() or f.result() for f in futs]


def test_registry_resolves_and_refuses():
    assert transports.resolve("auto", cuda=True) == "nccl"
    assert transports.resolve("auto", cuda=False) == "gloo"
    assert isinstance(transports.receiver("nccl"), NcclReceiver)
    with pytest.raises(ValueError, match="unknown weight transport 'carrier-pigeon'"):
        transports.resolve("carrier-pigeon", cuda=False)


def test_init_info_is_json_with_a_fresh_unique_id_per_group():
    net = FakeNccl()
    sender = NcclSender(device=CPU, factory=net.factory, unique_id=net.unique_id)
    a, b = sender.open(3, NetworkConfig()), sender.open(3, NetworkConfig())
    assert a["transport"] == "nccl" and a["world_size"] == 3
    assert a["nccl_unique_id_b64"] != b["nccl_unique_id_b64"]
    assert all(isinstance(v, str | int | float) for v in a.values())  # no pickle, no bytes


def test_round_trip_to_two_receivers_is_exact():
    net = FakeNccl()
    sender, recvs = pair(net, receivers=2)
    got: list[dict] = [{}, {}]
    out = both(lambda: sender.send(model(), version=4),
               [lambda i=i, r=r: r.receive(4, lambda b, i=i: got[i].update({n: t.clone() for n, t in b}))
                for i, r in enumerate(recvs)])  # fmt: skip
    stats = out[0]
    assert stats.tensors == 4 and stats.bytes == out[1][0] == out[2][0]
    for received in got:
        assert list(received) == [n for n, _ in model()]
        assert all(torch.equal(received[n], t) for n, t in model())


def test_a_version_mismatch_fails_both_ends_and_loads_nothing():
    net = FakeNccl()
    sender, (recv,) = pair(net)
    loaded: list = []
    out = both(lambda: sender.send(model(), version=1), [lambda: recv.receive(2, loaded.append)])
    assert isinstance(out[0], WeightSyncError) and "rejected" in str(out[0])
    assert isinstance(out[1], WeightSyncError) and "expected 2" in str(out[1])
    assert loaded == []


def test_a_corrupted_bucket_is_caught_by_the_device_checksum():
    net = FakeNccl()
    sender, (recv,) = pair(net, bucket_bytes=1 << 20)  # one bucket
    net.corrupt = True
    loaded: list = []
    out = both(lambda: sender.send(model(), version=3), [lambda: recv.receive(3, loaded.append)])
    assert isinstance(out[1], WeightSyncError) and "checksum" in str(out[1])
    assert isinstance(out[0], WeightSyncError) and loaded == []


def test_a_silent_receiver_fails_the_send_at_the_deadline_and_aborts_nccl():
    net = FakeNccl()
    sender, _ = pair(net)  # the receiver joined, then never receives
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match="did not finish within 1s.*aborted"):
        sender.send(model(), version=1)
    assert time.monotonic() - t0 < TIMEOUT_S + 2.0
    assert net.comms[0].aborted or any(c.aborted for c in net.comms)
    assert not sender.connected or sender._group.comm is None


def test_a_rendezvous_without_receivers_fails_at_the_deadline():
    net = FakeNccl()
    sender = NcclSender(timeout_s=TIMEOUT_S, device=CPU, factory=net.factory,
                        unique_id=net.unique_id, fence=net.fence)  # fmt: skip
    sender.open(2, NetworkConfig())
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match="rendezvous .* did not complete within 1s"):
        sender.connect()
    assert time.monotonic() - t0 < TIMEOUT_S + 2.0


def test_a_bad_unique_id_is_a_weight_sync_error():
    with pytest.raises(WeightSyncError, match="no valid unique id"):
        NcclReceiver().join({"world_size": 2, "nccl_unique_id_b64": "not base64!"}, 1, CPU)


def test_device_checksum_sees_a_flip_and_a_swap_and_not_the_order_of_chunks(monkeypatch):
    data = torch.randint(0, 256, (4096,), dtype=torch.uint8)
    base = device_checksum(data)
    flipped = data.clone()
    flipped[100] ^= 1
    swapped = data.clone()
    swapped[0:4], swapped[4:8] = data[4:8].clone(), data[0:4].clone()
    assert base != device_checksum(flipped)
    assert data[0:4].tolist() == data[4:8].tolist() or base != device_checksum(swapped)
    import asyncrl.core.weights.stream as w

    monkeypatch.setattr(w, "_CHECKSUM_CHUNK", 64)  # many chunks: the same value
    w._weights_cache.clear()
    assert w.device_checksum(data) == base
    w._weights_cache.clear()


def settled(check, within_s: float = 5.0) -> None:
    """The receivers record a version just after the sender's ack: wait for it, bounded."""
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, "the receivers did not record the version"
        time.sleep(0.01)


class _Actors:
    """A fake control plane whose actors are threads receiving through the nccl transport.
    ``dead`` actors stop answering anything from the version they are told to die at."""

    def __init__(self, net: FakeNccl, ids: list[int], die_at: dict[int, int]) -> None:
        self.net, self.die_at = net, die_at
        self.actors = {i: None for i in ids}
        self.inbox = {i: queue.Queue() for i in ids}
        self.outbox: queue.Queue = queue.Queue()
        self.versions: dict[int, int] = {}
        self.stopped = False
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in ids]
        for t in self.threads:
            t.start()

    def send(self, actor_id, msg) -> None:
        self.inbox[actor_id].put(msg)

    def broadcast(self, msg) -> None:
        for q in self.inbox.values():
            q.put(msg)

    def recv(self, timeout_s):
        try:
            return self.outbox.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def _run(self, actor_id: int) -> None:
        receiver = None
        while not self.stopped:
            try:
                msg = self.inbox[actor_id].get(timeout=0.1)
            except queue.Empty:
                continue
            if msg["type"] == "update" and self.die_at.get(actor_id) == msg["version"]:
                return  # dead: no receive, no pong
            if msg["type"] == "weights_init":
                receiver = NcclReceiver(factory=self.net.factory, fence=self.net.fence)
                try:
                    receiver.join(msg, msg["rank_offset"], CPU)
                except WeightSyncError:
                    receiver = None
            elif msg["type"] == "update" and receiver is not None:
                try:
                    receiver.receive(msg["version"], lambda b: None)
                    self.versions[actor_id] = msg["version"]
                except WeightSyncError:
                    pass
            elif msg["type"] == "ping":
                self.outbox.put({"type": "pong", "nonce": msg["nonce"], "actor_id": actor_id})


def test_the_channel_re_forms_the_group_without_a_dead_receiver_and_resends():
    net = FakeNccl()
    actors = _Actors(net, [0, 1, 2], die_at={1: 2})
    said: list[str] = []
    sender = NcclSender(bucket_bytes=1 << 10, timeout_s=TIMEOUT_S, device=CPU,
                        factory=net.factory, unique_id=net.unique_id, fence=net.fence)  # fmt: skip
    options = ChannelOptions(timeout_s=TIMEOUT_S, ping_s=TIMEOUT_S + 2)
    channel = ActorWeightChannel(actors, options, log=said.append, sender=sender).open()
    try:
        channel.sync(model(1), version=1)
        settled(lambda: actors.versions == {0: 1, 1: 1, 2: 1})
        channel.sync(model(2), version=2)  # actor 1 dies in here
        settled(lambda: actors.versions == {0: 2, 1: 1, 2: 2})
    finally:
        actors.stopped = True
    assert channel.members == [0, 2] and channel.failures == 1 and channel.rebuilds == 2
    assert any("new group with actors [0, 2]" in s for s in said), said
    assert channel.last_stats.tensors == 4


def test_two_workers_per_actor_take_consecutive_ranks():
    net = FakeNccl()
    sent: list[tuple[int, dict]] = []

    class Control:
        actors = {3: None, 5: None}

        def send(self, actor_id, msg):
            sent.append((actor_id, msg))

    sender = NcclSender(device=CPU, factory=net.factory, unique_id=net.unique_id)
    sender.connect = lambda: None  # no receivers here: only the plan is checked
    channel = ActorWeightChannel(Control(), ChannelOptions(workers_per_actor=2), sender=sender)
    channel.open()
    inits = [(a, m["rank_offset"], m["world_size"]) for a, m in sent]
    assert inits == [(3, 1, 5), (5, 3, 5)]
    assert channel.transport == "nccl"


def test_a_disabled_vllm_communicator_is_refused_not_used():
    """vLLM hands back a communicator whose collectives are no-ops when VLLM_DISABLE_PYNCCL is
    set: sending through it would 'succeed' with nothing moved."""
    net = FakeNccl()

    def disabled(uid, rank, world_size, device):
        comm = net.factory(uid, rank, world_size, device)
        comm.disabled = True
        return comm

    sender = NcclSender(timeout_s=TIMEOUT_S, device=CPU, factory=disabled, unique_id=net.unique_id)
    info = sender.open(2, NetworkConfig())
    with ThreadPoolExecutor(1) as ex:
        ex.submit(NcclReceiver(factory=net.factory).join, info, 1, CPU)
        with pytest.raises(WeightSyncError, match="VLLM_DISABLE_PYNCCL"):
            sender.connect()
