"""Overheads of the system over the bare libraries it wraps, on the demo model.

    python -m benchmarks.micro_overheads            # both parts -> results/micro_overheads.json
    python -m benchmarks.micro_overheads actor      # only the actor part
    python -m benchmarks.micro_overheads learner    # only the learner part (runs torchrun)
    python -m benchmarks.micro_overheads own        # the actor's own work, no model

actor: completion tokens/s of
  - bare:   ``vllm.LLM.generate`` on all prompts at once (offline batch: the best case);
  - engine: ``actors.engine.ActorEngine.generate``, one request per prompt, ``max_inflight``
            at once (our AsyncLLM wrapper, no buffer);
  - actor:  ``actors.actor.Actor.produce`` (lease, prompt cursor, generate, reward, Arrow
            encode, commit into a real redis-server), no learner;
  same prompts (the demo task's first ``--prompts``), n, max_tokens, temperature and seed,
  vLLM bound to the same core (``--core``), redis-server too unless ``--redis-core`` pins it
  elsewhere; ``--engine-core`` puts both engines' processes (engine core and worker) on a
  core of their own and leaves the client (and redis-server) on ``--core``, as
  ``actor.engine_cpus`` does; ``--rounds`` rounds of the three arms in turn,
  both engines alive throughout, the start-up heap frozen as an actor freezes it
  (asyncrl/heap.py); ratios are medians of the per-round ratios. Each arm also records the
  CPU seconds of the client and of each child process by name (``CpuMeter``).
own: the actor's own CPU per group, with no model: ``Actor.produce`` (everything the actor
  arm does but vLLM) over ``actors.sim_engine.SimEngine`` at 1e9 tokens/s, so completions of
  the demo's mean length come back at once, into a real redis-server; ``--prompts`` groups per
  round (default 1000 here), ``--rounds`` rounds; CPU ms per group of the client and of
  redis-server, all on ``--core``. Not part of ``all``.
learner: seconds per step on one batch of demo-sized groups, under ``torchrun
  --nproc_per_node=--nproc``, of
  - bare:   FSDP2 forward + REINFORCE-style token loss + backward + AdamW step;
  - ours:   ``learner.step.train_on_batch`` (advantages, registry loss, grad clip, metrics);
  - gather: ``learner.model.full_named_tensors`` (what precedes every weight sync).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, RESULTS, write_result


def _demo_cfg(extra: list[str]):
    from asyncrl.configload import load_config
    from asyncrl.orchestration.jobs import resolve_model

    cfg = load_config(["metrics_port=0", *extra])
    return cfg, resolve_model(cfg)


def _prompts(cfg, model_dir: str, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from actors.addition import AdditionSource

    tok = AutoTokenizer.from_pretrained(model_dir)
    src = AdditionSource(cfg.task.seed, split="train")
    return [tok.encode(src.get(i).text) for i in range(count)]


def bare_llm(model_dir: str, a, max_len: int):
    """The offline ``vllm.LLM`` (warmed up), for ``bare_round``."""
    from vllm import LLM

    return LLM(model=model_dir, dtype="float32", max_model_len=max_len, enforce_eager=True,
               kv_cache_memory_bytes=int(a.kv_cache_gib * 2**30) or None, seed=0,
               max_num_seqs=a.engine_batch)  # fmt: skip


def bare_round(llm, prompts, a) -> dict:
    """One offline batch: every prompt at once (vLLM's scheduler always has a queue)."""
    from vllm import SamplingParams

    params = SamplingParams(n=a.n_samples, max_tokens=a.max_tokens, temperature=a.temperature,
                            seed=0, logprobs=0, detokenize=False)  # fmt: skip
    inputs = [{"prompt_token_ids": p} for p in prompts]
    t0, cpu = time.perf_counter(), CpuMeter()
    outs = llm.generate(inputs, params, use_tqdm=False)
    dt, used = time.perf_counter() - t0, cpu.read()
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    return {"seconds": dt, "completion_tokens": tokens, "tokens_per_s": tokens / dt, **used}


async def engine_round(engine, prompts, a, inflight: int) -> dict:
    """``ActorEngine.generate``, one request per prompt, ``inflight`` at once."""
    limit = asyncio.Semaphore(inflight)

    async def one(i, p):
        async with limit:
            return await engine.generate(p, a.n_samples, a.max_tokens, a.temperature, i)

    t0, cpu = time.perf_counter(), CpuMeter()
    outs = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    dt, used = time.perf_counter() - t0, cpu.read()
    tokens = sum(len(c.token_ids) for cs in outs for c in cs)
    return {"seconds": dt, "completion_tokens": tokens, "tokens_per_s": tokens / dt, **used}


async def actor_round(cfg, model_dir: str, engine, prompts, url: str, name: str) -> dict:
    """``Actor.produce`` into a fresh buffer ``name`` until it committed every prompt."""
    from actors.actor import Actor
    from actors.addition import AdditionSource
    from actors.rewards import load_reward_fn
    from buffer.connection import connect
    from buffer.redis_buffer import ReplayBuffer

    buf = ReplayBuffer(connect(url), name, capacity=len(prompts) + 8)
    actor = Actor(cfg, 0, model_dir, buf, engine, AdditionSource(cfg.task.seed, split="train"),
                  load_reward_fn(cfg.task.reward_fn))  # fmt: skip
    t0, cpu = time.perf_counter(), CpuMeter()
    task = asyncio.create_task(actor.produce())
    while actor.state.committed < len(prompts):
        await asyncio.sleep(0.01)
    dt, used = time.perf_counter() - t0, cpu.read()
    actor.state.stop = True
    await task
    actor.scorer.close()
    s = actor.state
    return {"seconds": dt, "groups": s.committed, "completion_tokens": s.tokens_generated,
            "tokens_per_s": s.tokens_generated / dt, "time_s": actor.clock.totals(), **used}  # fmt: skip


async def interleaved(cfg, model_dir: str, prompts, url: str, rounds: int,
                      engine_cpus: list[int] | None = None) -> dict:  # fmt: skip
    """``rounds`` rounds of bare, engine and actor, one after the other in each round: the
    three arms share the core's slow and fast minutes (bare vLLM alone moved 30% between
    two runs of this benchmark minutes apart). Both engines live for the whole run; the
    idle one sleeps. ``engine_cpus``: both engines' processes start there, and this (client)
    process keeps its other cores (``actors.cpu_layout.engine_on``, as
    ``actor.engine_cpus``)."""
    from actors.cpu_layout import engine_on
    from actors.engine import ActorEngine
    from asyncrl.heap import freeze_startup_heap
    from buffer import codec

    a = cfg.actor
    with engine_on(engine_cpus):
        llm = bare_llm(model_dir, a, 64 + a.max_tokens)
        engine = await ActorEngine.start(
            model_dir, max_model_len=64 + a.max_tokens, seed=0, cpu_bind=a.cpu_bind or None,
            kv_cache_bytes=int(a.kv_cache_gib * 2**30), max_num_seqs=a.engine_batch,
            weight_backend=None,
        )  # fmt: skip
    codec.warm_up()  # as actors.main does while the engine starts (pyarrow's lazy imports)
    bare_round(llm, prompts[:4], a)  # warm-ups
    await engine_round(engine, prompts[:4], a, a.max_inflight)
    freeze_startup_heap()  # as actors.main does once its engine is up; bare gains from it too
    arms: dict[str, list[dict]] = {"bare_vllm": [], "engine": [], "actor": []}
    for r in range(rounds):
        arms["bare_vllm"].append(bare_round(llm, prompts, a))
        arms["engine"].append(await engine_round(engine, prompts, a, a.max_inflight))
        arms["actor"].append(await actor_round(cfg, model_dir, engine, prompts, url, f"ov{r}"))
        print(f"round {r + 1}/{rounds}: " + ", ".join(
            f"{k} {v[-1]['tokens_per_s']:.0f}" for k, v in arms.items()) + " tok/s", flush=True)  # fmt: skip
    await engine.shutdown()
    del llm
    return arms


class CpuMeter:
    """CPU seconds of this (client) process and of its descendants by process name (vLLM's
    ``VLLM::EngineCore`` and ``VLLM::Worker``, ``redis-server``) between construction and
    ``read()``: with everything on one core they add up to the wall time."""

    def __init__(self) -> None:
        import psutil

        self._me = psutil.Process()
        self._start = self._sample()

    def _sample(self) -> tuple[float, dict[int, tuple[str, float]]]:
        """(the client's CPU seconds, {descendant pid: (name, CPU seconds)})."""
        import psutil

        own, kids = self._me.cpu_times(), {}
        for child in self._me.children(recursive=True):
            try:
                t, name = child.cpu_times(), child.name()
            except psutil.Error:
                continue
            kids[child.pid] = (name, t.user + t.system)
        return own.user + own.system, kids

    def read(self) -> dict:
        (c0, kids0), (c1, kids1) = self._start, self._sample()
        by_name: dict[str, float] = {}
        for pid, (name, cpu) in kids1.items():
            by_name[name] = by_name.get(name, 0.0) + cpu - kids0.get(pid, (name, 0.0))[1]
        return {"client_cpu_s": c1 - c0, "children_cpu_s": sum(by_name.values()),
                "children_cpu_s_by_name": by_name}  # fmt: skip


def own_part(args) -> dict:
    """``Actor.produce`` over an instant ``SimEngine``: the actor's own work per group."""
    from actors.sim_engine import SimEngine
    from buffer import codec
    from buffer.server import RedisServer

    os.sched_setaffinity(0, {args.core})
    cfg, model_dir = _demo_cfg(args.set)
    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    groups = args.prompts or 1000
    codec.warm_up()

    async def rounds(url: str) -> list[dict]:
        out = []
        for r in range(args.rounds):
            engine = SimEngine(vocab, 1e9, cfg.actor.sim_mean_len, seed=r)
            res = await actor_round(cfg, model_dir, engine, range(groups), url, f"own{r}")
            out.append(res)
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{k} {v:.3f}" for k, v in _per_group(res).items()) + " ms a group", flush=True)  # fmt: skip
        return out

    with tempfile.TemporaryDirectory() as tmp, RedisServer(tmp) as server:
        runs = asyncio.run(rounds(server.url))
    med = {k: statistics.median(_per_group(r)[k] for r in runs) for k in _per_group(runs[0])}
    print("own work (medians, ms a group): " + ", ".join(f"{k} {v:.3f}" for k, v in med.items()),
          flush=True)  # fmt: skip
    return {"groups": groups, "core": args.core, "rounds": args.rounds, "runs": runs,
            "ms_per_group_median": med}  # fmt: skip


def _per_group(run: dict) -> dict[str, float]:
    """Wall, client CPU and redis-server CPU of an ``actor_round``, in ms a group."""
    n, by_name = run["groups"], run["children_cpu_s_by_name"]
    redis = sum(v for k, v in by_name.items() if k.startswith("redis"))
    return {"wall": 1000 * run["seconds"] / n, "client_cpu": 1000 * run["client_cpu_s"] / n,
            "redis_cpu": 1000 * redis / n}  # fmt: skip


def _summary(runs: list[dict]) -> dict:
    rates = [r["tokens_per_s"] for r in runs]
    return {"tokens_per_s_median": statistics.median(rates), "tokens_per_s": rates,
            "runs": runs}  # fmt: skip


def actor_part(args) -> dict:
    from buffer.server import RedisServer

    # client, engine core and worker on one core, or the engine's two apart (--engine-core)
    engine_core = args.core if args.engine_core is None else args.engine_core
    os.sched_setaffinity(0, {args.core, engine_core})
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(engine_core)  # bare LLM binds like the actor
    cfg, model_dir = _demo_cfg([f"actor.cpu_bind='{engine_core}'", *args.set])
    prompts = _prompts(cfg, model_dir, args.prompts or 256)
    with tempfile.TemporaryDirectory() as tmp, RedisServer(tmp) as server:
        # with the client, unless --redis-core sets the buffer apart as a service
        os.sched_setaffinity(
            server.pid, {args.core if args.redis_core is None else args.redis_core}
        )
        arms = asyncio.run(interleaved(cfg, model_dir, prompts, server.url, args.rounds,
                                       [engine_core] if engine_core != args.core else None))  # fmt: skip
    out = {"prompts": len(prompts), "core": args.core, "redis_core": args.redis_core,
           "engine_core": args.engine_core, "rounds": args.rounds,
           **{k: _summary(v) for k, v in arms.items()}}  # fmt: skip
    bare = [r["tokens_per_s"] for r in arms["bare_vllm"]]
    for k in ("engine", "actor"):
        ratios = [r["tokens_per_s"] / b for r, b in zip(arms[k], bare, strict=True)]
        out[f"{k}_vs_bare_per_round"] = ratios
        out[f"{k}_vs_bare"] = statistics.median(ratios)
    for k, runs in arms.items():
        out[k]["client_cpu_share_median"] = statistics.median(
            r["client_cpu_s"] / r["seconds"] for r in runs)  # fmt: skip
        out[k]["children_cpu_ms_per_group_median"] = statistics.median(
            1000 * r["children_cpu_s"] / len(prompts) for r in runs)  # fmt: skip
    print("CPU (medians): " + ", ".join(
        f"{k}: client {out[k]['client_cpu_share_median']:.0%} of the wall time, child "
        f"processes (engine, redis-server) {out[k]['children_cpu_ms_per_group_median']:.1f} ms "
        "a group" for k in arms), flush=True)  # fmt: skip
    med = {k: out[k]["tokens_per_s_median"] for k in arms}
    print(f"actor ({args.rounds} interleaved rounds, medians): bare vLLM {med['bare_vllm']:.0f} "
          f"tok/s, ActorEngine {med['engine']:.0f} tok/s ({out['engine_vs_bare']:.2f}x), Actor "
          f"{med['actor']:.0f} tok/s ({out['actor_vs_bare']:.2f}x; median of per-round "
          "ratios)", flush=True)  # fmt: skip
    return out


def learner_part(args) -> dict:
    from asyncrl.torchrun import free_port as _free_port

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "learner.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.nproc}",
               f"--master_port={_free_port()}", "--master_addr=127.0.0.1", "-m",
               "benchmarks.overheads_learner", "--out", str(out), "--repeat", str(args.repeat),
               *(f"--set={kv}" for kv in args.set)]  # fmt: skip
        env = dict(os.environ, OMP_NUM_THREADS="1")
        subprocess.run(cmd, cwd=REPO, env=env, check=True, timeout=1200)
        res = json.loads(out.read_text())
    print(f"learner ({args.nproc} ranks): bare FSDP2 step {res['bare']['median_s']:.3f} s, "
          f"train_on_batch {res['ours']['median_s']:.3f} s "
          f"({res['ours']['median_s'] / res['bare']['median_s']:.2f}x), full-weight gather "
          f"{res['gather']['median_s']:.4f} s", flush=True)  # fmt: skip
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.micro_overheads")
    p.add_argument("part", nargs="?", choices=["actor", "learner", "own", "all"], default="all")
    p.add_argument("--prompts", type=int, default=None,
                   help="prompts (groups) per run: actor 256, own 1000 by default")  # fmt: skip
    p.add_argument("--core", type=int, default=1, help="core for the actor measurements")
    p.add_argument("--engine-core", type=int, default=None,
                   help="actor part: vLLM's engine core and worker (both engines') on this core, "
                        "the client on --core (default: all on --core)")  # fmt: skip
    p.add_argument("--redis-core", type=int, default=None,
                   help="actor part: pin redis-server to this core (default: --core, with "
                        "everything else)")  # fmt: skip
    p.add_argument("--nproc", type=int, default=2, help="learner ranks")
    p.add_argument("--repeat", type=int, default=10, help="learner steps timed per arm")
    p.add_argument("--rounds", type=int, default=5,
                   help="interleaved rounds of the actor part's three arms")  # fmt: skip
    p.add_argument("--name", default="micro_overheads")
    p.add_argument("--out", type=Path, default=RESULTS, help="directory for the JSON")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for every part (repeatable)")  # fmt: skip
    args = p.parse_args(argv)
    results = {}
    if args.part in ("learner", "all"):
        results["learner"] = learner_part(args)
    if args.part in ("actor", "all"):
        results["actor"] = actor_part(args)
    if args.part == "own":
        results["own"] = own_part(args)
    name = args.name if args.part == "all" else f"{args.name}_{args.part}"
    config = {**vars(args), "out": None}  # not a machine-specific path
    print(f"wrote {write_result(name, {'config': config, 'results': results}, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
