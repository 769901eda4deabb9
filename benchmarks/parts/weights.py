"""Weight-transfer micro-benchmark: the gloo engine vs a plain memory copy of the same bytes.

    python -m benchmarks.parts.weights           # -> benchmarks/results/micro_weights.json

Sender: the ``--transport`` sender of ``asyncrl.core.weights.transports`` (what learner rank 0 runs; gloo
by default, ``nccl`` needs one GPU per rank). Receivers: ``--receivers`` processes joining the
same group on loopback through the transport's receiver (what the vLLM worker plugin runs),
loading every tensor
by copying it into a preallocated tensor of its shape (what a model load costs at least).
A sync returns after every receiver verified the checksums and acknowledged.

Models: the demo model (its safetensors file) and a random GPT-2-small-shaped float32
model (~124M parameters). Baseline: ``dst.copy_(src)`` of every tensor on this machine, the
fastest a same-host transfer of these bytes could be; and the sender's packing + checksum alone
(no network), to show how much of a sync is CPU work rather than the wire. Timings are
medians over --repeat.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

import torch

from benchmarks.common import timed, write_result


def random_model(layers: int = 12, hidden: int = 768, vocab: int = 50257) -> dict:
    """GPT-2-small shapes in float32: 12 x (attn 4h^2 + mlp 8h^2) + embeddings ~ 124M."""
    g = torch.Generator().manual_seed(0)
    t = {"embed.weight": torch.randn(vocab, hidden, generator=g)}
    for i in range(layers):
        for name, shape in (("qkv", (3 * hidden, hidden)), ("o", (hidden, hidden)),
                            ("up", (4 * hidden, hidden)), ("down", (hidden, 4 * hidden))):  # fmt: skip
            t[f"layers.{i}.{name}.weight"] = torch.randn(*shape, generator=g)
        t[f"layers.{i}.norm.weight"] = torch.ones(hidden)
    return t


def demo_model() -> dict:
    from safetensors.torch import load_file

    from asyncrl.core.config.load import load_config
    from asyncrl.orchestration.launch.preflight import resolve_model

    model_dir = resolve_model(load_config([]))
    return load_file(f"{model_dir}/model.safetensors")


def _receiver(info: dict, rank: int, repeat: int, shapes: dict, q) -> None:
    torch.set_num_threads(1)
    from asyncrl.core.weights import transports

    device = _device(info["transport"], rank)
    dst = {n: torch.empty(s, dtype=d, device=device) for n, (s, d) in shapes.items()}

    def load(tensors):
        for name, t in tensors:
            dst[name].copy_(t)

    receiver = transports.receiver(info["transport"])
    receiver.join(info, rank, device)
    for v in range(repeat + 1):
        receiver.receive(v, load)
    q.put(rank)


def _device(transport: str, rank: int) -> torch.device:
    """nccl: one GPU per rank (rank r on GPU r % count); gloo: the host."""
    if transport == "nccl":
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def transfer(tensors: dict, receivers: int, repeat: int, bucket_mb: int,
             transport: str = "gloo") -> dict:  # fmt: skip
    """Learner rank 0's send (``asyncrl.core.weights.transports``) to ``receivers`` processes."""
    from asyncrl.core.config.network import NetworkConfig
    from asyncrl.core.weights import transports

    world = 1 + receivers
    shapes = {n: (tuple(t.shape), t.dtype) for n, t in tensors.items()}
    sender = transports.sender(transport, bucket_bytes=bucket_mb << 20, timeout_s=300.0,
                               device=_device(transport, 0))  # fmt: skip
    info = sender.open(world, NetworkConfig())
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_receiver, args=(info, r, repeat, shapes, q))
             for r in range(1, world)]  # fmt: skip
    for pr in procs:
        pr.start()
    sender.connect()
    times = []
    for v in range(repeat + 1):  # version 0 warms up the connections
        stats = sender.send(tensors.items(), v)
        if v:
            times.append(stats.seconds)
    for pr in procs:
        pr.join(60)
    sender.close()
    nbytes = stats.bytes
    med = statistics.median(times)
    return {"bytes": nbytes, "seconds_median": med, "seconds_min": min(times),
            "GB_per_s": nbytes / med / 1e9, "receivers": receivers, "bucket_MB": bucket_mb,
            "transport": transport}  # fmt: skip


def pack_only(tensors: dict, repeat: int, bucket_mb: int) -> dict:
    """The sender's CPU work without the network: packing each bucket's payload and its
    checksum (the receiver repeats the checksum), to show how much of a sync is not the wire."""
    from asyncrl.core.weights.stream import host_checksum, pack_payload, plan_buckets

    def new(nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def pack():
        for bucket in plan_buckets(tensors.items(), bucket_mb << 20):
            meta_len, payload = pack_payload(bucket, new)
            host_checksum(payload[meta_len:])

    t = timed(pack, repeat)
    return {"seconds_median": t["median_s"]}


def memcopy(tensors: dict, repeat: int) -> dict:
    dst = {n: torch.empty_like(t) for n, t in tensors.items()}

    def copy():
        for n, t in tensors.items():
            dst[n].copy_(t)

    t = timed(copy, repeat)
    nbytes = sum(x.numel() * x.element_size() for x in tensors.values())
    return {"bytes": nbytes, "seconds_median": t["median_s"], "GB_per_s": nbytes / t["median_s"] / 1e9}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.parts.weights")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--receivers", type=int, default=1, help="receiving processes (actors)")
    p.add_argument("--bucket-mb", type=int, default=64, help="the sender's bucket size")
    p.add_argument("--transports", default="gloo,shm",
                   help="comma list of gloo, shm, nccl (nccl: one GPU per rank)")  # fmt: skip
    p.add_argument("--name", default="micro_weights")
    args = p.parse_args(argv)
    names = [t for t in args.transports.split(",") if t]
    torch.set_num_threads(1)
    results = {}
    for label, build in (("demo", demo_model), ("random_124m", random_model)):
        tensors = build()
        params = sum(t.numel() for t in tensors.values())
        t0 = time.perf_counter()
        copy = memcopy(tensors, args.repeat)
        row = {"parameters": params, "memcpy": copy,
               "sender_pack_checksum": pack_only(tensors, args.repeat, args.bucket_mb)}  # fmt: skip
        for name in names:  # side by side in one run: this machine is shared and noisy
            row[name] = transfer(tensors, args.receivers, args.repeat, args.bucket_mb, name)
            row[f"{name}_share_of_memcpy"] = copy["seconds_median"] / row[name]["seconds_median"]
        row["wall_s"] = time.perf_counter() - t0
        results[label] = row
        print(f"{label}: {params / 1e6:.1f}M params, {copy['bytes'] / 1e6:.1f} MB; memcpy "
              f"{copy['seconds_median']:.4f} s; " + "; ".join(
                  f"{n} {row[n]['seconds_median']:.3f} s ({row[n]['GB_per_s']:.2f} GB/s, "
                  f"{100 * row[f'{n}_share_of_memcpy']:.1f}% of memcpy)" for n in names),
              flush=True)  # fmt: skip
        del tensors
    path = write_result(args.name, {"config": vars(args), "results": results})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
