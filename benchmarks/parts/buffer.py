"""Buffer micro-benchmark: groups/s and MB/s through Redis + Arrow, codec cost, bytes/token.

    python -m benchmarks.parts.buffer            # -> benchmarks/results/micro_buffer.json

For each group shape (the demo's, and a realistic RLVR one: 8 completions of 1024 tokens
after a 256-token prompt) it measures, on a private redis-server (AOF on, as in a run):

- encode / decode: ``asyncrl.buffer.codec.encode_group`` and ``decode_group`` (full validation);
- bytes per token of the Arrow payload versus two pickle baselines (the ``Group`` dataclass,
  and a plain dict of lists), each measured on the same group;
- commit: ``lease`` + ``commit`` (one Lua call each; the XADD carries the payload);
- read: ``read`` (XREADGROUP + decode + validate) + ``ack`` (XACK + XDEL), in batches of 16;
- pipeline: one writer thread and one reader thread at once (what a run does).

Tokens per group counts prompt + completion tokens of every sample (what the payload holds).
"""

from __future__ import annotations

import argparse
import pickle
import random
import tempfile
import threading
import time
from dataclasses import asdict

from benchmarks.common import timed, write_result

SHAPES = {
    "demo": {"n": 8, "prompt_len": 8, "completion_len": 12},
    "rlvr": {"n": 8, "prompt_len": 256, "completion_len": 1024},
}


def make_group(rng: random.Random, gid: str, n: int, prompt_len: int, completion_len: int):
    from asyncrl.buffer.testing import f32
    from asyncrl.core.types import Group, Sample

    prompt = [rng.randrange(150_000) for _ in range(prompt_len)]
    samples = [
        Sample(
            prompt_ids=list(prompt),
            completion_ids=[rng.randrange(150_000) for _ in range(completion_len)],
            behavior_logprobs=[f32(-rng.expovariate(1.0)) for _ in range(completion_len)],
            token_versions=[7] * (completion_len // 2) + [8] * (completion_len - completion_len // 2),
            reward=f32(rng.random()),
        )
        for _ in range(n)
    ]  # fmt: skip
    return Group(group_id=gid, prompt_index=0, actor_id=0, samples=samples)


def codec_figures(group, repeat: int) -> dict:
    from asyncrl.buffer.codec import decode_group, encode_group

    payload = encode_group(group)
    tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in group.samples)
    pickled = pickle.dumps(group, protocol=pickle.HIGHEST_PROTOCOL)
    plain = pickle.dumps(asdict(group), protocol=pickle.HIGHEST_PROTOCOL)
    return {
        "tokens_per_group": tokens,
        "payload_bytes": len(payload),
        "bytes_per_token": {
            "arrow": len(payload) / tokens,
            "pickle_dataclass": len(pickled) / tokens,
            "pickle_dict": len(plain) / tokens,
        },
        "encode": timed(lambda: encode_group(group), repeat),
        "decode_validate": timed(lambda: decode_group(payload, vocab_size=150_000), repeat),
        "pickle_dumps": timed(lambda: pickle.dumps(group, protocol=5), repeat),
        "pickle_loads": timed(lambda: pickle.loads(pickled), repeat),
    }


def redis_figures(url: str, groups: list, payload_bytes: int) -> dict:
    from asyncrl.buffer.connection import connect
    from asyncrl.buffer.redis_buffer import ReplayBuffer

    n = len(groups)
    buf = ReplayBuffer(connect(url), f"bench-{time.monotonic_ns()}", capacity=n + 1)
    t0 = time.perf_counter()
    for g in groups:
        buf.commit(buf.lease(0, 5.0), g)
    commit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = 0
    while got < n:
        entries = buf.read("learner", 16, 1000, vocab_size=150_000)
        buf.ack([e.entry_id for e in entries], "trained")
        got += len(entries)
    read_s = time.perf_counter() - t0
    mb = n * payload_bytes / 1e6
    return {
        "groups": n,
        "commit": {"groups_per_s": n / commit_s, "MB_per_s": mb / commit_s},
        "read_ack": {"groups_per_s": n / read_s, "MB_per_s": mb / read_s},
        "pipeline": _pipeline(url, groups, payload_bytes),
    }


def _pipeline(url: str, groups: list, payload_bytes: int) -> dict:
    """A writer and a reader thread at once through a buffer of capacity 64."""
    from asyncrl.buffer.connection import connect
    from asyncrl.buffer.redis_buffer import ReplayBuffer

    name = f"bench-pipe-{time.monotonic_ns()}"
    writer = ReplayBuffer(connect(url), name, capacity=64)
    reader = ReplayBuffer(connect(url), name, capacity=64)

    def write():
        for i, g in enumerate(groups):
            g.group_id = f"p{i}"
            writer.commit(writer.lease(0, 30.0), g)

    t0 = time.perf_counter()
    th = threading.Thread(target=write)
    th.start()
    got = 0
    while got < len(groups):
        entries = reader.read("learner", 16, 1000, vocab_size=150_000)
        reader.ack([e.entry_id for e in entries], "trained")
        got += len(entries)
    th.join()
    dt = time.perf_counter() - t0
    return {"groups_per_s": len(groups) / dt, "MB_per_s": len(groups) * payload_bytes / 1e6 / dt}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.parts.buffer")
    p.add_argument("--groups", type=int, default=400, help="groups per Redis measurement")
    p.add_argument("--repeat", type=int, default=50, help="codec timing repeats")
    p.add_argument("--name", default="micro_buffer")
    args = p.parse_args(argv)

    from asyncrl.buffer.service.server import RedisServer

    rng = random.Random(0)
    results = {}
    with tempfile.TemporaryDirectory() as tmp, RedisServer(tmp) as server:
        for shape, dims in SHAPES.items():
            g = make_group(rng, "g", **dims)
            codec = codec_figures(g, args.repeat)
            groups = [make_group(rng, f"{shape}-{i}", **dims) for i in range(args.groups)]
            red = redis_figures(server.url, groups, codec["payload_bytes"])
            results[shape] = {"shape": dims, "codec": codec, "redis": red}
            _print(shape, dims, codec, red)
    path = write_result(args.name, {"config": vars(args) | {"shapes": SHAPES}, "results": results})
    print(f"wrote {path}")
    return 0


def _print(shape: str, dims: dict, c: dict, r: dict) -> None:
    b = c["bytes_per_token"]
    print(
        f"{shape:5s} {dims}: {c['payload_bytes'] / 1e3:.1f} kB/group; bytes/token arrow "
        f"{b['arrow']:.2f}, pickle(dataclass) {b['pickle_dataclass']:.2f}, pickle(dict) "
        f"{b['pickle_dict']:.2f}; encode {1e3 * c['encode']['median_s']:.3f} ms, decode+validate "
        f"{1e3 * c['decode_validate']['median_s']:.3f} ms (pickle dumps "
        f"{1e3 * c['pickle_dumps']['median_s']:.3f} / loads {1e3 * c['pickle_loads']['median_s']:.3f} ms)"
    )
    for k in ("commit", "read_ack", "pipeline"):
        print(f"      {k:9s} {r[k]['groups_per_s']:8.0f} groups/s {r[k]['MB_per_s']:8.1f} MB/s")


if __name__ == "__main__":
    raise SystemExit(main())
