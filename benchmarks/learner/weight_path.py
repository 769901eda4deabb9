"""The sender's half of a weight sync, from a GPU learner's memory: how fast the bytes leave.

    python -m benchmarks.learner.weight_path                         # qwen2.5-1.5b shape, on the GPU
    python -m benchmarks.learner.weight_path --preset tiny --device cpu   # the plumbing, on a CPU

The model is a state dict of the preset's shape (``benchmarks.learner.throughput_model.PRESETS``,
built on the meta device, then every tensor filled with random numbers on ``--device`` in the
float32 master dtype, as FSDP2's full tensors are on learner rank 0). Each path is the
transport's own code over a local stand-in for its group (no receiver: NCCL between two
ranks needs two GPUs), timed as one whole sync, median of ``--repeat`` after a warm-up:

  host_stream   what the shm and gloo senders do first: ``weights.base.cast`` (each tensor
                to the wire dtype, then ``.to("cpu")``: a pageable device-to-host copy), then
                ``weights.stage_stream`` packs every bucket into host memory and checksums it
                (XXH3, ``host_checksum``). shm packs into ``/dev/shm`` files; here plain host
                memory, so the figure excludes page-cache effects.
  device_stream what the nccl sender does before its broadcasts: the cast on the GPU, every
                bucket packed in GPU memory and checksummed there (``device_checksum``).
  d2h_pageable  the ceiling of the first copy: the whole model's wire bytes in one contiguous
                device tensor copied to pageable host memory;
  d2h_pinned    the same into pinned host memory (``non_blocking``, then synchronized).

Figures: seconds per sync and GB/s of wire bytes (1 GB = 1e9 bytes). On a CPU the d2h arms
are host-to-host copies, reported but meaningless as transfer rates.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from asyncrl.core.weights.base import cast
from asyncrl.core.weights.stream import (
    DEFAULT_BUCKET_BYTES,
    device_checksum,
    host_checksum,
    stage_stream,
)
from benchmarks.common import RESULTS, write_result
from benchmarks.learner.throughput_model import PRESETS


class LocalGroup:
    """The sender's side of a transport group with no receivers: where payloads live and how
    they are checksummed (``asyncrl.core.weights.stream.Collective``'s sender methods used by
    ``stage_stream``)."""

    rank = 0

    def __init__(self, device: torch.device):
        self.device = device
        self.checksum = device_checksum if device.type == "cuda" else host_checksum

    def new_payload(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)


def state_dict(preset: str, device: torch.device, seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    """``(name, float32 tensor on device)`` for every entry of the preset model's state dict,
    as the learner's ``full_named_tensors`` yields it (a tied head under both names, one
    tensor)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = dict(PRESETS[preset]["model"])
    config = AutoConfig.for_model(shape.pop("model_type"), **shape)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    made: dict[int, torch.Tensor] = {}
    gen = torch.Generator(device=device).manual_seed(seed)
    entries = meta.state_dict(keep_vars=True).items()  # the parameters themselves: ties kept
    for _, t in entries:
        if id(t) not in made:
            made[id(t)] = torch.randn(t.shape, generator=gen, device=device)
    return [(name, made[id(t)]) for name, t in entries]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_sync(fn, device: torch.device, repeat: int) -> list[float]:
    """Seconds of ``repeat`` calls of ``fn`` after one warm-up, each synchronized."""
    fn()
    _sync(device)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times


def measure(named, device: torch.device, wire: torch.dtype, bucket_bytes: int, repeat: int):
    """Every path's times, and the wire bytes of one sync."""
    wire_bytes = sum(t.numel() * (wire.itemsize if t.is_floating_point() else t.element_size())
                     for _, t in named)  # fmt: skip
    flat = torch.empty(wire_bytes, dtype=torch.uint8, device=device)
    pageable = torch.empty(wire_bytes, dtype=torch.uint8)
    pinned = torch.empty(wire_bytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    host, dev = LocalGroup(torch.device("cpu")), LocalGroup(device)

    def host_stream():
        stage_stream(host, cast(named, wire, "cpu"), 0, bucket_bytes)

    def device_stream():
        messages, _, _ = stage_stream(dev, cast(named, wire, device), 0, bucket_bytes)
        del messages

    paths = {
        "host_stream": host_stream,
        "device_stream": device_stream,
        "d2h_pageable": lambda: pageable.copy_(flat),
        "d2h_pinned": lambda: pinned.copy_(flat, non_blocking=True),
    }
    return wire_bytes, {k: timed_sync(fn, device, repeat) for k, fn in paths.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.learner.weight_path", description=__doc__
    )
    p.add_argument("--preset", default="qwen2.5-1.5b", choices=sorted(PRESETS))
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--wire-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--bucket-mb", type=int, default=DEFAULT_BUCKET_BYTES >> 20)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--name", help="result name (default weight_path_<preset>_<device>)")
    args = p.parse_args(argv)
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    t0 = time.monotonic()
    named = state_dict(args.preset, device)
    print(f"weight_path: {args.preset} state dict, {len(named)} tensors on {device} "
          f"({time.monotonic() - t0:.0f} s to build)", flush=True)  # fmt: skip
    wire = getattr(torch, args.wire_dtype)
    wire_bytes, times = measure(named, device, wire, args.bucket_mb << 20, args.repeat)
    paths = {}
    for k, ts in times.items():
        med = statistics.median(ts)
        paths[k] = {"median_s": med, "times_s": ts, "gb_per_s": wire_bytes / med / 1e9}
        print(f"  {k:14s} {med:8.3f} s  {paths[k]['gb_per_s']:7.2f} GB/s", flush=True)
    gpu = None
    if cuda:
        props = torch.cuda.get_device_properties(device)
        gpu = {"name": props.name, "memory_gib": props.total_memory / 2**30,
               "cuda": torch.version.cuda}  # fmt: skip
    payload = {
        "config": {"preset": args.preset, "device": str(device), "wire_dtype": args.wire_dtype,
                   "bucket_mb": args.bucket_mb, "repeat": args.repeat, "tensors": len(named),
                   "master_dtype": "float32"},  # fmt: skip
        "gpu": gpu,
        "wire_bytes": wire_bytes,
        "paths": paths,
        "notes": "Sender side only (no receiver). host_stream: cast to the wire dtype and a "
                 "pageable copy per tensor, packed into host buckets with XXH3 checksums (the "
                 "shm/gloo senders); device_stream: packed and checksummed in GPU memory (the "
                 "nccl sender). d2h_*: one contiguous copy of the wire bytes.",
    }  # fmt: skip
    name = args.name or f"weight_path_{args.preset}_{device.type}"
    print(f"wrote {write_result(name, payload, Path(args.out))}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
