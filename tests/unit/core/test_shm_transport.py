"""The shm transport (asyncrl/core/weights/shm.py) with real files and real gloo groups on
loopback, sender and receivers as threads: buckets read in place,
a sync's buckets are files the next sync rewrites in place (views valid until then), a
receiver that is not on the learner's host refused, a damaged
file caught by the checksum, orphaned directories of dead learners removed."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from asyncrl.core.config.network import NetworkConfig
from asyncrl.core.weights import transports
from asyncrl.core.weights.gloo import GlooReceiver, GlooSender
from asyncrl.core.weights.shm import PREFIX, ShmReceiver, ShmSender, remove_orphans
from asyncrl.core.weights.stream import WeightSyncError

TIMEOUT_S = 5.0


def model(seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        ("embed.weight", torch.randn(300, 64, generator=g)),
        ("layer.bias", torch.randn(3, generator=g)),
        ("layer.weight", torch.randn(64, 32, generator=g).bfloat16()),
        ("steps", torch.arange(5, dtype=torch.int64)),
    ]


def pair(receivers: int = 1, bucket_bytes: int = 16 << 10, kind: str = "shm",
         timeout_s: float = TIMEOUT_S):  # fmt: skip
    send_cls, recv_cls = (ShmSender, ShmReceiver) if kind == "shm" else (GlooSender, GlooReceiver)
    sender = send_cls(bucket_bytes=bucket_bytes, timeout_s=timeout_s)
    info = sender.open(1 + receivers, NetworkConfig())
    recvs = [recv_cls() for _ in range(receivers)]
    with ThreadPoolExecutor(receivers) as ex:
        joins = [ex.submit(r.join, info, 1 + i) for i, r in enumerate(recvs)]
        sender.connect()
        for j in joins:
            j.result()
    return sender, recvs, Path(info.get("shm_dir", "/nonexistent"))


def both(send, recvs):
    with ThreadPoolExecutor(1 + len(recvs)) as ex:
        futs = [ex.submit(send)] + [ex.submit(r) for r in recvs]
    return [f.exception() or f.result() for f in futs]


def test_auto_is_shm_on_one_host_only():
    assert transports.resolve("auto", cuda=False, same_host=True) == "shm"
    assert transports.resolve("auto", cuda=False, same_host=False) == "gloo"
    assert transports.resolve("auto", cuda=True, same_host=True) == "nccl"


def test_two_receivers_read_the_buckets_in_place_and_the_next_sync_reuses_the_files():
    sender, recvs, directory = pair(receivers=2)
    kept: list[dict] = [{}, {}]
    try:
        for version in (1, 2):
            out = both(lambda v=version: sender.send(model(v), v),
                       [lambda r=r, i=i, v=version: r.receive(v, kept[i].update)
                        for i, r in enumerate(recvs)])  # fmt: skip
            assert out[0].tensors == 4 and out[1] == out[2] == (out[0].bytes, 4)
            files = sorted(p.name for p in directory.iterdir())
            if version == 1:
                first = files
            assert files == first and len(files) > 2  # buckets 0.. and the token, reused
            for got in kept:  # views into the files: the sent values until the next sync
                assert all(torch.equal(got[n], t) for n, t in model(version))
    finally:
        sender.close()
        for r in recvs:
            r.close()
    assert not directory.exists()


@pytest.mark.parametrize("kind", ["shm", "gloo"])
def test_a_close_during_a_deferred_ack_returns_at_once_and_the_ack_fails_when_the_receiver_leaves(
    kind,
):
    """A stopping learner closes the group while ``collect_ack`` (its thread) waits on a
    receiver that never answers: ``close`` only detaches the group, so it returns at once
    instead of after the collective's deadline (CI of stop 24: a learner outlived its
    SIGKILLed launcher by 60 s; destroying a gloo group under a running collective blocks
    until it ends, and can abort the process). Once the receiver leaves, the ack fails and
    tears the group down."""
    sender, recvs, directory = pair(kind=kind, timeout_s=60.0)
    if kind == "shm":
        sender.send(model(1), 1, wait_ack=False)  # staged; its headers wait for the receiver
    with ThreadPoolExecutor(1) as ex:
        ack = ex.submit(sender.collect_ack, 1)
        time.sleep(0.5)
        assert not ack.done(), "vacuous: the ack did not wait for the receiver"
        t0 = time.monotonic()
        sender.close()
        took = time.monotonic() - t0
        assert took < 5.0, f"close blocked {took:.1f}s on the collective under way"
        assert not directory.exists()
        recvs[0].close()
        with pytest.raises(WeightSyncError):
            ack.result(timeout=30)


def test_a_receiver_elsewhere_is_refused_naming_gloo():
    sender = ShmSender(timeout_s=TIMEOUT_S)
    info = sender.open(2, NetworkConfig())
    try:
        with pytest.raises(WeightSyncError, match="learner.weight_transport=gloo"):
            ShmReceiver().join({**info, "shm_token": "another host's"}, 1)
        with pytest.raises(WeightSyncError, match="not on the learner's host"):
            ShmReceiver().join({**info, "shm_dir": "/nonexistent/dir"}, 1)
    finally:
        sender.close()


def test_a_bucket_damaged_in_shared_memory_is_refused_by_both_ends(monkeypatch):
    sender, (recv,), directory = pair(bucket_bytes=1 << 20)  # one bucket
    group = sender._shm
    checksum = group.checksum

    def damage(data):  # the sender's checksum is taken, then the file changes
        value = checksum(data)
        data[-1] ^= 1
        return value

    monkeypatch.setattr(group, "checksum", damage)
    loaded: list = []
    out = both(lambda: sender.send(model(), 3), [lambda: recv.receive(3, loaded.append)])
    sender.close()
    recv.close()
    assert isinstance(out[1], WeightSyncError) and "checksum" in str(out[1])
    assert isinstance(out[0], WeightSyncError) and loaded == []


def test_directories_of_dead_learners_are_removed(tmp_path):
    dead = tmp_path / f"{PREFIX}999999999-abc"  # no such pid
    live = tmp_path / f"{PREFIX}{os.getpid()}-def"
    other = tmp_path / "unrelated"
    for d in (dead, live, other):
        d.mkdir()
        (d / "0").write_bytes(b"x")
    assert remove_orphans(str(tmp_path)) == [str(dead)]
    assert live.exists() and other.exists() and not dead.exists()
