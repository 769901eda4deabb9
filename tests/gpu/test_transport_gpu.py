"""The nccl transport's GPU-side pieces on one GPU: the stream packed and checksummed on the
device agrees with the host's, and the NCCL sender packs, checksums and streams GPU tensors
to a receiver on the same GPU (one GPU cannot hold two NCCL ranks, so the communicator and
its fences are the fake of tests/unit/core/fake_nccl.py). Skipped without a CUDA GPU;
the CPU version is tests/unit/core/test_nccl_transport.py. NCCL between two GPUs needs a machine
with two GPUs (not verified)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from asyncrl.core.config.network import NetworkConfig
from asyncrl.core.weights.nccl import NcclReceiver, NcclSender
from asyncrl.core.weights.stream import device_checksum, pack_bucket, unpack_bucket
from tests.unit.core.fake_nccl import FakeNccl

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA GPU (torch.cuda.is_available() is False); runs on a GPU machine",
    ),
]


def _model(device) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("embed.weight", torch.randn(1000, 64, generator=g).bfloat16().to(device)),
        ("norm.weight", torch.randn(3, generator=g).to(device)),
    ]


def test_device_checksum_on_gpu_equals_the_host_value():
    data = torch.randint(0, 256, (1 << 20,), dtype=torch.uint8)
    assert device_checksum(data.cuda()) == device_checksum(data)


def test_a_bucket_packed_on_the_gpu_unpacks_to_the_same_tensors():
    tensors = _model("cuda")
    meta, data = pack_bucket(tensors, torch.device("cuda"))
    assert data.is_cuda
    for (name, t), (got_name, got) in zip(tensors, unpack_bucket(meta, data), strict=True):
        assert name == got_name and torch.equal(t, got)


def test_the_nccl_sender_streams_from_gpu_memory_to_a_gpu_receiver():
    net = FakeNccl()
    cuda = torch.device("cuda", 0)
    sender = NcclSender(
        bucket_bytes=1 << 16,
        timeout_s=30.0,
        device=cuda,
        factory=net.factory,
        unique_id=net.unique_id,
    )  # fmt: skip  (real CUDA event fences)
    info = sender.open(2, NetworkConfig())
    receiver = NcclReceiver(factory=net.factory, fence=net.fence)
    got: dict = {}
    with ThreadPoolExecutor(2) as ex:
        join = ex.submit(receiver.join, info, 1, cuda)
        sender.connect()
        join.result()
        recv = ex.submit(receiver.receive, 5, lambda b: got.update({n: t.clone() for n, t in b}))
        stats = sender.send(_model(cuda), version=5)
        assert recv.result() == (stats.bytes, stats.tensors)
    assert all(got[n].is_cuda and torch.equal(got[n], t) for n, t in _model(cuda))
