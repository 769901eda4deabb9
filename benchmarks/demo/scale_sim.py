"""Scale: many simulated actors drive the real learner and buffer on this machine.

    python -m benchmarks.demo.scale_sim                  # -> benchmarks/results/scale_sim.json
    python -m benchmarks.demo.scale_sim --actors 1 8 32 64 --steps 60

Part ``learner``: for each K in --actors, a real ``asyncrl run`` (demo model, 1 learner
rank) with K actor processes using the simulated engine (``actor.engine=sim``: no model,
random completions at ``--tokens-per-s`` each; real buffer, real weight broadcast to every
actor). Offered load grows with K; the learner's trained groups/s stops following it where
the learner saturates, and the actors' ``waiting_buffer`` time (backpressure) shows it.

Part ``buffer``: K writer processes commit demo-sized groups to one Redis as fast as they
can while one reader drains (read + validate + ack), for --buffer-seconds; aggregate
groups/s vs K shows where Redis + Arrow saturates without any learner.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, md_table, write_result


def learner_point(k: int, args, runs_dir: Path) -> dict:
    run_dir = runs_dir / f"sim-k{k}"
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    overrides = [
        "actor.engine=sim", f"actor.num_actors={k}", f"actor.sim_tokens_per_s={args.tokens_per_s}",
        "learner.nproc=1", f"learner.steps={args.steps}", "learner.checkpoint_every=0",
        "metrics_port=0", f"buffer.max_staleness={args.max_staleness}", f"run_dir={run_dir}",
    ]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "asyncrl.orchestration.cli", "run", *overrides], cwd=REPO,
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    if proc.returncode:
        return {"actors": k, "error": proc.stdout[-2000:] + proc.stderr[-2000:]}
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = recs[len(recs) // 4 :]
    step = statistics.median(r["step_s"] for r in steady)
    groups_per_step = json.loads((run_dir / "config.json").read_text())["learner"]["batch_groups"]
    actors = [json.loads(p.read_text()) for p in run_dir.glob("actor*.json")]
    time_s: dict[str, float] = {}
    for a in actors:
        for s, v in a["time_s"].items():
            if s != "starting":
                time_s[s] = time_s.get(s, 0.0) + v
    total = sum(time_s.values()) or 1.0
    lt = {k2: sum(r[f"{k2}_s"] for r in steady) for k2 in ("busy", "waiting_data", "weight_sync")}
    lt_total = sum(lt.values()) or 1.0
    return {
        "actors": k,
        "offered_tokens_per_s": k * args.tokens_per_s,
        "trained_groups_per_s": groups_per_step / step,
        "step_s_median": step,
        "weight_sync_s_median": statistics.median(r["weight_sync_s"] for r in steady),
        "learner_time_frac": {s: v / lt_total for s, v in lt.items()},
        "actor_time_frac": {s: v / total for s, v in time_s.items()},
        "generated_groups_per_s": sum(a["groups_generated"] for a in actors)
        / (total / max(1, len(actors))),
        "process_s": time.monotonic() - t0,
    }


def _writer(url: str, name: str, seconds: float, seed: int, ready, start, q) -> None:
    from asyncrl.buffer.connection import connect
    from asyncrl.buffer.redis_buffer import ReplayBuffer
    from asyncrl.buffer.testing import random_group

    buf = ReplayBuffer(connect(url), name, capacity=1024)
    rng = random.Random(seed)
    groups = [random_group(rng, f"{seed}:{i}", n=8, max_len=12) for i in range(256)]
    ready.put(seed)
    start.wait()
    n, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        lease = buf.lease(seed, 1.0)
        if lease:
            g = groups[n % len(groups)]
            g.group_id = f"{seed}:{n}"
            buf.commit(lease, g)
            n += 1
    q.put(n)


def buffer_point(k: int, url: str, seconds: float) -> dict:
    """K writer processes (groups generated before the clock starts) and one reader."""
    from asyncrl.buffer.connection import connect
    from asyncrl.buffer.redis_buffer import ReplayBuffer

    name = f"scale-{k}-{time.monotonic_ns()}"
    reader = ReplayBuffer(connect(url), name, capacity=1024)
    ctx = mp.get_context("spawn")
    q, ready, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_writer, args=(url, name, seconds, i, ready, start, q))
             for i in range(k)]  # fmt: skip
    for p in procs:
        p.start()
    for _ in procs:  # every writer connected and has its groups: start the clock
        ready.get(timeout=600)
    start.set()
    read, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        entries = reader.read("learner", 64, 200, vocab_size=100)
        reader.ack([e.entry_id for e in entries], "trained")
        read += len(entries)
    dt = time.monotonic() - t0
    written = sum(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    return {"writers": k, "read_groups_per_s": read / dt, "committed_groups_per_s": written / dt}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.demo.scale_sim")
    p.add_argument("part", nargs="?", choices=["learner", "buffer", "all"], default="all")
    p.add_argument("--actors", type=int, nargs="+", default=[1, 4, 16, 32])
    p.add_argument("--writers", type=int, nargs="+", default=[1, 4, 16, 32, 64])
    p.add_argument("--tokens-per-s", type=float, default=100.0, help="per simulated engine")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--max-staleness", type=int, default=1)
    p.add_argument("--buffer-seconds", type=float, default=10.0)
    p.add_argument("--name", default="scale_sim")
    args = p.parse_args(argv)
    results: dict = {}
    if args.part in ("learner", "all"):
        runs_dir = REPO / "runs" / "benchmarks" / args.name
        results["learner"] = []
        for k in args.actors:
            r = learner_point(k, args, runs_dir)
            results["learner"].append(r)
            print(json.dumps(r), flush=True)
    if args.part in ("buffer", "all"):
        from asyncrl.buffer.service.server import RedisServer

        results["buffer"] = []
        with tempfile.TemporaryDirectory() as tmp, RedisServer(tmp) as server:
            for k in args.writers:
                r = buffer_point(k, server.url, args.buffer_seconds)
                results["buffer"].append(r)
                print(json.dumps(r), flush=True)
    table = _table(results)
    print(table)
    name = args.name if args.part == "all" else f"{args.name}_{args.part}"
    path = write_result(name, {"config": vars(args), "results": results, "table_markdown": table,
                               "cores": os.cpu_count()})  # fmt: skip
    print(f"wrote {path}")
    return 0


def _table(results: dict) -> str:
    out = []
    if results.get("learner"):
        rows = [[r["actors"], r.get("offered_tokens_per_s"), r.get("trained_groups_per_s"),
                 r.get("step_s_median"), r.get("weight_sync_s_median"),
                 100 * r.get("learner_time_frac", {}).get("waiting_data", 0),
                 100 * r.get("actor_time_frac", {}).get("waiting_buffer", 0),
                 100 * r.get("actor_time_frac", {}).get("waiting_weights", 0)]
                for r in results["learner"] if "error" not in r]  # fmt: skip
        out.append(md_table(["sim actors", "offered tok/s", "trained groups/s", "step s",
                             "weight sync s", "learner waiting %", "actor waiting_buffer %",
                             "actor waiting_weights %"], rows))  # fmt: skip
    if results.get("buffer"):
        rows = [[r["writers"], r.get("committed_groups_per_s"), r["read_groups_per_s"]]
                for r in results["buffer"]]  # fmt: skip
        out.append(
            md_table(["writer processes", "committed groups/s", "read+acked groups/s"], rows)
        )
    return "\n\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
