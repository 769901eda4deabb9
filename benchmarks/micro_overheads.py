"""Overheads of the system over the bare libraries it wraps, on the demo model.

    python -m benchmarks.micro_overheads            # both parts -> results/micro_overheads.json
    python -m benchmarks.micro_overheads actor      # only the actor part
    python -m benchmarks.micro_overheads learner    # only the learner part (runs torchrun)

actor: completion tokens/s of
  - bare:   ``vllm.LLM.generate`` on all prompts at once (offline batch: the best case);
  - engine: ``actors.engine.ActorEngine.generate``, one request per prompt, ``max_inflight``
            at once (our AsyncLLM wrapper, no buffer);
  - actor:  ``actors.actor.Actor.produce`` (lease, prompt cursor, generate, reward, Arrow
            encode, commit into a real redis-server), no learner;
  same prompts (the demo task's first ``--prompts``), n, max_tokens, temperature and seed,
  vLLM bound to the same core (``--core``).
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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, write_result


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


def bare_vllm(model_dir: str, prompts, a, max_len: int) -> dict:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, dtype="float32", max_model_len=max_len, enforce_eager=True,
              kv_cache_memory_bytes=int(a.kv_cache_gib * 2**30) or None, seed=0,
              max_num_seqs=a.max_inflight * a.n_samples)  # fmt: skip
    params = SamplingParams(n=a.n_samples, max_tokens=a.max_tokens, temperature=a.temperature,
                            seed=0, logprobs=0, detokenize=False)  # fmt: skip
    inputs = [{"prompt_token_ids": p} for p in prompts]
    llm.generate(inputs[:4], params, use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(inputs, params, use_tqdm=False)
    dt = time.perf_counter() - t0
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    del llm
    return {"seconds": dt, "completion_tokens": tokens, "tokens_per_s": tokens / dt}


async def engine_and_actor(cfg, model_dir: str, prompts, url: str) -> dict:
    from actors.actor import Actor
    from actors.addition import AdditionSource
    from actors.engine import ActorEngine
    from actors.rewards import load_reward_fn
    from buffer import codec
    from buffer.connection import connect
    from buffer.redis_buffer import ReplayBuffer

    a = cfg.actor
    engine = await ActorEngine.start(
        model_dir, max_model_len=64 + a.max_tokens, kv_cache_bytes=int(a.kv_cache_gib * 2**30),
        seed=0, cpu_bind=a.cpu_bind or None, max_num_seqs=a.max_inflight * a.n_samples,
        weight_backend=None,
    )  # fmt: skip
    limit = asyncio.Semaphore(a.max_inflight)

    async def one(i, p):
        async with limit:
            return await engine.generate(p, a.n_samples, a.max_tokens, a.temperature, i)

    await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts[:4])))  # warm-up
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    dt = time.perf_counter() - t0
    tokens = sum(len(c.token_ids) for cs in outs for c in cs)
    result = {"engine": {"seconds": dt, "completion_tokens": tokens, "tokens_per_s": tokens / dt}}

    codec.warm_up()  # as actors.main does while the engine starts (pyarrow's lazy imports)
    buf = ReplayBuffer(connect(url), "overheads", capacity=len(prompts) + 8)
    actor = Actor(cfg, 0, model_dir, buf, engine, AdditionSource(cfg.task.seed, split="train"),
                  load_reward_fn(cfg.task.reward_fn))  # fmt: skip
    t0 = time.perf_counter()
    task = asyncio.create_task(actor.produce())
    while actor.state.committed < len(prompts):
        await asyncio.sleep(0.01)
    dt = time.perf_counter() - t0
    actor.state.stop = True
    await task
    actor.scorer.close()
    s = actor.state
    result["actor"] = {"seconds": dt, "groups": s.committed, "completion_tokens": s.tokens_generated,
                       "tokens_per_s": s.tokens_generated / dt, "time_s": actor.clock.totals()}  # fmt: skip
    await engine.shutdown()
    return result


def actor_part(args) -> dict:
    from buffer.server import RedisServer

    os.sched_setaffinity(0, {args.core})  # client, engine core and worker all on one core
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(args.core)  # bare LLM binds like the actor
    cfg, model_dir = _demo_cfg([f"actor.cpu_bind='{args.core}'", *args.set])
    prompts = _prompts(cfg, model_dir, args.prompts)
    bare = bare_vllm(model_dir, prompts, cfg.actor, 64 + cfg.actor.max_tokens)
    with tempfile.TemporaryDirectory() as tmp, RedisServer(tmp) as server:
        ours = asyncio.run(engine_and_actor(cfg, model_dir, prompts, server.url))
    out = {"prompts": len(prompts), "core": args.core, "bare_vllm": bare, **ours}
    for k in ("engine", "actor"):
        out[f"{k}_vs_bare"] = ours[k]["tokens_per_s"] / bare["tokens_per_s"]
    print(f"actor: bare vLLM {bare['tokens_per_s']:.0f} tok/s, ActorEngine "
          f"{ours['engine']['tokens_per_s']:.0f} tok/s ({out['engine_vs_bare']:.2f}x), Actor "
          f"{ours['actor']['tokens_per_s']:.0f} tok/s ({out['actor_vs_bare']:.2f}x)", flush=True)  # fmt: skip
    return out


def learner_part(args) -> dict:
    from asyncrl.torchrun import free_port as _free_port

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "learner.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.nproc}",
               f"--master_port={_free_port()}", "--master_addr=127.0.0.1", "-m",
               "benchmarks.overheads_learner", "--out", str(out), "--repeat", str(args.repeat)]  # fmt: skip
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
    p.add_argument("part", nargs="?", choices=["actor", "learner", "all"], default="all")
    p.add_argument("--prompts", type=int, default=256, help="prompts (groups) per actor run")
    p.add_argument("--core", type=int, default=1, help="core for the actor measurements")
    p.add_argument("--nproc", type=int, default=2, help="learner ranks")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--name", default="micro_overheads")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for the actor part (repeatable)")  # fmt: skip
    args = p.parse_args(argv)
    results = {}
    if args.part in ("learner", "all"):
        results["learner"] = learner_part(args)
    if args.part in ("actor", "all"):
        results["actor"] = actor_part(args)
    name = args.name if args.part == "all" else f"{args.name}_{args.part}"
    print(f"wrote {write_result(name, {'config': vars(args), 'results': results})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
