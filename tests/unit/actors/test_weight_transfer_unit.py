"""The gloo weight-stream protocol (asyncrl/core/weights/stream.py) over real gloo, no vLLM.

Sender and receiver are two threads of this process, each with its own gloo group object
(gloo does not care that the ranks share a process). Deadlines are short so the dead-peer
tests finish in seconds.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from asyncrl.actors.engine.vllm_engine import token_versions_from_spans
from asyncrl.core.config.network import NetworkConfig
from asyncrl.core.runtime.torchrun import free_port
from asyncrl.core.weights.gloo import GlooGroup, GlooSender
from asyncrl.core.weights.stream import (
    ALIGN,
    KIND_BUCKET,
    KIND_END,
    WeightSyncError,
    _header,
    host_checksum,
    pack_bucket,
    plan_buckets,
    receive_stream,
    send_stream,
    unpack_bucket,
)

TIMEOUT_S = 3.0


def sample_tensors() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("model.embed_tokens.weight", torch.randn(64, 32, generator=g)),
        ("model.layers.0.self_attn.q_proj.bias", torch.randn(3, generator=g)),  # 12 B: pads
        ("model.layers.0.mlp.up_proj.weight", torch.randn(16, 8, generator=g).bfloat16()),
        ("scalar", torch.tensor(2.5)),
        ("counts", torch.arange(5, dtype=torch.int64)),
        ("transposed", torch.randn(4, 6, generator=g).t()),  # non-contiguous view
    ]


def connect_pair(world_size: int = 2):
    """Rank 0 and ranks 1.. of one group, formed concurrently as in production."""
    port = free_port()
    with ThreadPoolExecutor(world_size) as ex:
        futs = [
            ex.submit(GlooGroup, "127.0.0.1", port, r, world_size, TIMEOUT_S)
            for r in range(world_size)
        ]
        return [f.result() for f in futs]


def run_both(send_fn, recv_fns):
    """Run the sender and receivers concurrently; return their results or exceptions."""
    with ThreadPoolExecutor(1 + len(recv_fns)) as ex:
        futs = [ex.submit(send_fn)] + [ex.submit(f) for f in recv_fns]
        out = []
        for f in futs:
            try:
                out.append(f.result())
            except Exception as e:  # the tests assert on which side raised what
                out.append(e)
        return out


def test_plan_buckets_keeps_order_and_bounds_size():
    tensors = [(f"t{i}", torch.zeros(n)) for i, n in enumerate([10, 10, 10, 100, 1, 1])]
    # float32: 40 B -> 48 aligned; 400 B -> 400; 4 B -> 16.
    buckets = list(plan_buckets(tensors, bucket_bytes=100))
    assert [[n for n, _ in b] for b in buckets] == [["t0", "t1"], ["t2"], ["t3"], ["t4", "t5"]]
    for b in buckets:  # a bucket over the limit holds exactly one oversized tensor
        size = sum((t.numel() * 4 + ALIGN - 1) // ALIGN * ALIGN for _, t in b)
        assert size <= 100 or len(b) == 1
    with pytest.raises(ValueError):
        list(plan_buckets(tensors, bucket_bytes=0))


def test_pack_unpack_round_trip_is_bit_exact_and_aligned():
    tensors = sample_tensors()
    meta, data = pack_bucket(tensors)
    assert len(meta) % ALIGN == 0 and data.numel() % ALIGN == 0
    payload = torch.cat([torch.frombuffer(bytearray(meta), dtype=torch.uint8), data])
    out = unpack_bucket(payload[: len(meta)].numpy().tobytes(), payload[len(meta) :])
    assert [n for n, _ in out] == [n for n, _ in tensors]
    for (_, want), (_, got) in zip(tensors, out, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want)
        assert got.data_ptr() % ALIGN == payload.data_ptr() % ALIGN  # in-place view


def test_unpack_rejects_unknown_dtype_and_overrun():
    meta = b'{"names":["x"],"dtypes":["os"],"shapes":[[1]],"offsets":[0]}'
    with pytest.raises(WeightSyncError, match="unknown dtype"):
        unpack_bucket(meta, torch.zeros(16, dtype=torch.uint8))
    meta = b'{"names":["x"],"dtypes":["float32"],"shapes":[[8]],"offsets":[0]}'
    with pytest.raises(WeightSyncError, match="runs past"):
        unpack_bucket(meta, torch.zeros(16, dtype=torch.uint8))


def test_stream_delivers_every_tensor_bit_exact_to_every_receiver():
    tensors = sample_tensors()
    groups = connect_pair(world_size=3)
    received: list[dict[str, torch.Tensor]] = [{}, {}]

    def receiver(i):
        def load(batch):
            received[i].update({n: t.clone() for n, t in batch})

        return lambda: receive_stream(groups[i + 1], 7, load)

    out = run_both(
        lambda: send_stream(groups[0], iter(tensors), 7, bucket_bytes=256),
        [receiver(0), receiver(1)],
    )
    total = sum(len(pack_bucket([t])[1]) for t in tensors)
    assert out[0] == out[1] == out[2] == (total, len(tensors))
    for got in received:
        assert list(got) == [n for n, _ in tensors]
        for name, want in tensors:
            assert torch.equal(got[name], want)


def test_version_mismatch_fails_both_sides_and_group_stays_usable():
    groups = connect_pair()
    tensors = sample_tensors()
    out = run_both(
        lambda: send_stream(groups[0], tensors, 1),
        [lambda: receive_stream(groups[1], 2, lambda batch: None)],
    )
    assert isinstance(out[0], WeightSyncError) and "rejected" in str(out[0])
    assert isinstance(out[1], WeightSyncError) and "expected 2" in str(out[1])
    # The receiver drained the stream, so the next sync on the same group works.
    out = run_both(
        lambda: send_stream(groups[0], tensors, 2),
        [lambda: receive_stream(groups[1], 2, lambda batch: None)],
    )
    assert not any(isinstance(o, Exception) for o in out)


def test_load_error_in_receiver_is_reported_to_sender():
    groups = connect_pair()

    def bad_load(batch):
        raise KeyError("no such parameter")

    out = run_both(
        lambda: send_stream(groups[0], sample_tensors(), 3, bucket_bytes=64),
        [lambda: receive_stream(groups[1], 3, bad_load)],
    )
    assert isinstance(out[0], WeightSyncError)
    assert isinstance(out[1], WeightSyncError) and "no such parameter" in str(out[1])


def test_checksum_mismatch_is_caught_before_loading():
    """A sender that lies about a bucket's checksum: the receiver must refuse to load it."""
    groups = connect_pair()
    loaded = []
    meta, data = pack_bucket(sample_tensors()[:2])

    def lying_sender():
        g = groups[0]
        g.broadcast(_header(KIND_BUCKET, 4, len(meta), data.numel(), host_checksum(data) ^ 1))
        g.broadcast(torch.cat([torch.frombuffer(bytearray(meta), dtype=torch.uint8), data]))
        g.broadcast(_header(KIND_END, 4, 2, data.numel(), 1))
        return g.all_max(0)

    out = run_both(lying_sender, [lambda: receive_stream(groups[1], 4, loaded.append)])
    assert out[0] == 1  # the receiver reported failure in the ack
    assert isinstance(out[1], WeightSyncError) and "checksum" in str(out[1])
    assert loaded == []


def test_sender_connect_times_out_when_no_receiver_joins():
    sender = GlooSender(timeout_s=2.0)
    sender.open(2, NetworkConfig())
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match="rendezvous failed"):
        sender.connect()
    assert time.monotonic() - t0 < 10.0
    assert not sender.connected


def test_send_raises_within_deadline_when_receiver_never_receives():
    sender = GlooSender(bucket_bytes=1 << 10, timeout_s=2.0)
    port = sender.open(2, NetworkConfig())["master_port"]
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(GlooGroup, "127.0.0.1", port, 1, 2, 2.0)  # joins, then goes silent
        sender.connect()
        receiver = fut.result()
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError):
        sender.send(sample_tensors(), version=1)
    assert time.monotonic() - t0 < 10.0
    sender.close()
    receiver.close()


def test_receiver_raises_within_deadline_when_sender_dies():
    groups = connect_pair()
    result = {}

    def recv():
        try:
            receive_stream(groups[1], 1, lambda batch: None)
        except WeightSyncError as e:
            result["error"] = e

    t = threading.Thread(target=recv)
    t0 = time.monotonic()
    t.start()
    groups[0].close()  # the sender goes away without sending
    t.join(timeout=15.0)
    assert not t.is_alive(), "receiver hung"
    assert "error" in result and time.monotonic() - t0 < 15.0


def test_weight_sender_stats_and_wire_dtype():
    sender = GlooSender(bucket_bytes=1 << 12, timeout_s=TIMEOUT_S, wire_dtype=torch.bfloat16)
    groups_port = sender.open(2, NetworkConfig())["master_port"]
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(GlooGroup, "127.0.0.1", groups_port, 1, 2, TIMEOUT_S)
        sender.connect()
        receiver = fut.result()
    got = {}
    tensors = sample_tensors()
    out = run_both(
        lambda: sender.send(tensors, version=5),
        [lambda: receive_stream(receiver, 5, lambda b: got.update(dict(b)))],
    )
    stats = out[0]
    assert stats.tensors == len(tensors) and stats.bytes == out[1][0] and stats.seconds > 0
    assert got["model.embed_tokens.weight"].dtype == torch.bfloat16  # floats cast
    assert got["counts"].dtype == torch.int64  # integers untouched
    sender.close()
    receiver.close()


class Span:
    def __init__(self, version: str, start: int, end: int):
        self.version, self.start, self.end = version, start, end


def test_token_versions_from_spans():
    spans = [Span("3", 0, 2), Span("4", 2, 5)]
    assert token_versions_from_spans(spans, 5) == [3, 3, 4, 4, 4]
    assert token_versions_from_spans([], 0) == []
    with pytest.raises(ValueError, match="cover"):
        token_versions_from_spans(spans, 6)
    with pytest.raises(ValueError, match="tile"):
        token_versions_from_spans([Span("3", 1, 5)], 5)
    with pytest.raises(ValueError, match="non-integer"):
        token_versions_from_spans([Span("default", 0, 5)], 5)
    with pytest.raises(ValueError, match="no weight-version spans"):
        token_versions_from_spans(None, 2)


def test_trailer_mismatch_means_incomplete_sync():
    """The trailer says more tensors were sent than arrived: the receiver must not accept."""
    groups = connect_pair()
    meta, data = pack_bucket(sample_tensors()[:2])

    def short_sender():
        g = groups[0]
        g.broadcast(_header(KIND_BUCKET, 6, len(meta), data.numel(), host_checksum(data)))
        g.broadcast(torch.cat([torch.frombuffer(bytearray(meta), dtype=torch.uint8), data]))
        g.broadcast(_header(KIND_END, 6, 3, data.numel(), 1))
        return g.all_max(0)

    out = run_both(short_sender, [lambda: receive_stream(groups[1], 6, lambda b: None)])
    assert out[0] == 1
    assert isinstance(out[1], WeightSyncError) and "incomplete" in str(out[1])
