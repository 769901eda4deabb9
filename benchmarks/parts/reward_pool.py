"""Does a slow reward stall generation?

    python -m benchmarks.parts.reward_pool                 # -> results/reward_pool.{json,png}
    python -m benchmarks.parts.reward_pool --window 10 --reps 5 --core 0

One in-process ``asyncrl.actors.actor.Actor`` (``Actor.produce``: lease, generate, reward, Arrow
encode, commit into a real redis-server) on the simulated engine (``actors/engine/sim.py``:
``--tokens-per-s`` shared by the requests in flight, completion lengths geometric with mean
``--mean-len``), no learner (the buffer is big enough for every group). Arms, run in turn
``--reps`` times each (interleaved, so drift on a shared machine hits every arm alike):

    instant            addition_reward (microseconds), the default pool (4 processes)
    sleep50_process    a reward that sleeps 50 ms, 4 worker processes (the default)
    sleep50_thread     the same, 4 threads
    sleep50_thread1    the same, 1 thread: one call at a time, as before the reward pool

Per arm: the actor's completion tokens/s over a ``--window`` s window (from the first to
the last group it finished in it) after a ``--warmup`` s warm-up (worker processes start, the engine's queue fills); the figure is the ratio of a
sleeping arm's tokens/s to the instant arm's (target >= 0.90). A pool keeps up while the
samples/s the engine makes stay below ``reward_workers / 0.05 s`` (80/s with 4 workers); the
JSON records both.

Pinning: this process (event loop, reward threads), the reward worker processes and the
redis-server all run on core ``--core`` (``sched_setaffinity``, inherited by children), with
``OMP_NUM_THREADS=MKL_NUM_THREADS=1``; a sleeping reward needs no CPU, so one core is enough
and the arms do not compete with other jobs for a second one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import RESULTS, write_result

SLEEP_S = 0.05
SPEC = "benchmarks.parts.reward_pool:sleep_50ms_reward"
ARMS = {  # name: (reward spec, executor, workers)
    "instant": ("asyncrl.actors.data.addition:addition_reward", "process", 4),
    "sleep50_process": (SPEC, "process", 4),
    "sleep50_thread": (SPEC, "thread", 4),
    "sleep50_thread1": (SPEC, "thread", 1),
}


def sleep_50ms_reward(prompt: str, completion: str, **fields) -> float:
    """A reward that waits 50 ms (a verifier server, a sandbox run) and returns 0.5."""
    time.sleep(SLEEP_S)
    return 0.5


def _cfg(args, arm: str, buffer_name: str):
    from asyncrl.core.config.job import Config

    spec, executor, workers = ARMS[arm]
    cfg = Config()
    cfg.buffer.name, cfg.buffer.capacity = buffer_name, 100_000
    cfg.actor.engine, cfg.actor.max_inflight = "sim", 16
    cfg.sampling.n_samples, cfg.sampling.max_tokens = args.n, args.max_tokens
    t = cfg.task
    t.reward_fn, t.reward_executor, t.reward_workers = spec, executor, workers
    return cfg


async def _run_arm(args, arm: str, url: str, model_dir: str, rep: int) -> dict:
    from asyncrl.actors.actor import Actor
    from asyncrl.actors.data.addition import AdditionSource
    from asyncrl.actors.engine.sim import SimEngine
    from asyncrl.actors.rewards.loading import load_reward_fn
    from asyncrl.buffer.connection import connect
    from asyncrl.buffer.redis_buffer import ReplayBuffer

    cfg = _cfg(args, arm, f"rp_{arm}_{rep}")
    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    engine = SimEngine(vocab, args.tokens_per_s, args.mean_len, seed=rep)
    buf = ReplayBuffer(connect(url), cfg.buffer.name, cfg.buffer.capacity)
    prompts = AdditionSource(cfg.task.seed, split="train")
    actor = Actor(cfg, 0, model_dir, buf, engine, prompts, load_reward_fn(cfg.task.reward_fn))
    task = asyncio.create_task(actor.produce())
    try:
        await asyncio.sleep(args.warmup)
        changes = await _watch(actor.state, args.window)
    finally:
        actor.state.stop = True
        await task
        actor.scorer.close()
    (t0, tok0, samples0), (t1, tok1, samples1) = changes[0], changes[-1]
    dt = t1 - t0
    return {
        "tokens_per_s": (tok1 - tok0) / dt,
        "samples_per_s": (samples1 - samples0) / dt,
        "groups": len(changes) - 1,
        "reward_errors": actor.state.reward_errors,
    }


async def _watch(state, window: float) -> list[tuple[float, int, int]]:
    """(time, tokens, samples) at each group the actor finished within ``window`` seconds.
    Rates are taken from the first to the last of them: a window's edges would count a
    group of ~1000 tokens or none, depending on where they fall."""
    changes, seen = [], -1
    end = time.perf_counter() + window
    while time.perf_counter() < end:
        if state.tokens_generated != seen:
            seen = state.tokens_generated
            changes.append((time.perf_counter(), seen, state.samples_generated))
        await asyncio.sleep(0.002)
    return changes


def _plot(arms: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(arms)
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    means = [arms[n]["tokens_per_s"]["mean"] for n in names]
    errs = [arms[n]["tokens_per_s"]["std"] for n in names]
    ax.bar(names, means, yerr=errs, color=["grey", "C0", "C1", "C3"][: len(names)])
    for i, n in enumerate(names):
        ax.text(i, means[i], f"{arms[n]['ratio_vs_instant']:.2f}x", ha="center", va="bottom")
    ax.set_ylabel("actor completion tokens/s")
    ax.set_title("reward 50 ms vs instant (ratio on the bars)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.parts.reward_pool")
    p.add_argument("--tokens-per-s", type=float, default=4000.0, help="sim engine rate")
    p.add_argument("--mean-len", type=float, default=128.0, help="mean completion tokens")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--n", type=int, default=8, help="samples per prompt (group size)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds before each window")
    p.add_argument("--window", type=float, default=8.0, help="measured seconds per run")
    p.add_argument("--reps", type=int, default=3, help="runs of each arm, interleaved")
    p.add_argument("--core", type=int, default=1, help="the one core everything runs on")
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of arms")
    p.add_argument("--name", default="reward_pool")
    args = p.parse_args(argv)
    arms = args.arms.split(",")
    os.sched_setaffinity(0, {args.core})  # inherited by redis-server and reward workers
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # before transformers loads numpy
        os.environ[var] = "1"

    from asyncrl.buffer.service.server import RedisServer
    from asyncrl.orchestration.demo.tokenizer import save_tokenizer

    runs: dict[str, list[dict]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory() as tmp, RedisServer(Path(tmp) / "redis") as server:
        model_dir = Path(tmp) / "model"
        model_dir.mkdir()
        tok = save_tokenizer(model_dir)
        (model_dir / "config.json").write_text(json.dumps({"vocab_size": len(tok)}))
        for rep in range(args.reps):
            for arm in arms:
                r = asyncio.run(_run_arm(args, arm, server.url, str(model_dir), rep))
                runs[arm].append(r)
                tps, sps = r["tokens_per_s"], r["samples_per_s"]
                print(f"rep {rep} {arm:16s} {tps:7.0f} tok/s {sps:5.1f} samples/s", flush=True)
    base = statistics.fmean(r["tokens_per_s"] for r in runs[arms[0]])
    summary = {}
    for arm in arms:
        tps = [r["tokens_per_s"] for r in runs[arm]]
        spec, executor, workers = ARMS[arm]
        summary[arm] = {
            "reward": spec,
            "executor": executor,
            "reward_workers": workers,
            "tokens_per_s": {"mean": statistics.fmean(tps), "std": statistics.pstdev(tps)},
            "samples_per_s": statistics.fmean(r["samples_per_s"] for r in runs[arm]),
            "ratio_vs_instant": statistics.fmean(tps) / base,
            "reward_errors": sum(r["reward_errors"] for r in runs[arm]),
            "runs": runs[arm],
        }
        mean, ratio = summary[arm]["tokens_per_s"]["mean"], summary[arm]["ratio_vs_instant"]
        print(f"{arm:16s} {mean:7.0f} tok/s, {ratio:.2f}x {arms[0]}", flush=True)
    pinning = (
        f"everything on core {args.core} (sched_setaffinity, inherited by redis-server and "
        "reward workers); OMP_NUM_THREADS=MKL_NUM_THREADS=1"
    )
    config = {**vars(args), "reward_sleep_s": SLEEP_S, "max_inflight": 16, "pinning": pinning}
    payload = {"config": {**config, "target_ratio": 0.90}, "arms": summary}
    if len(arms) > 1:
        _plot(summary, RESULTS / f"{args.name}.png")
    print(f"pinning: {pinning}\nwrote {write_result(args.name, payload)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
