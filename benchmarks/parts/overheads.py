"""Overheads of the system over the bare libraries it wraps, on the demo model or a real one.

    python -m benchmarks.parts.overheads            # both parts -> results/micro_overheads.json
    python -m benchmarks.parts.overheads actor      # only the actor part
    python -m benchmarks.parts.overheads learner    # only the learner part (runs torchrun)
    python -m benchmarks.parts.overheads own        # the actor's own work, no model
    python -m benchmarks.parts.overheads actor --model smollm2 --dtypes float32,bfloat16

actor: completion tokens/s of bare ``vllm.LLM.generate`` (offline batch), ``ActorEngine``
  alone and ``Actor.produce`` into a real redis-server (benchmarks/parts/overheads_actor.py): same
  prompts (the task's first ``--prompts``), sampling and engine options, vLLM bound to the
  same core (``--core``), redis-server too unless ``--redis-core`` pins it elsewhere;
  ``--engine-core`` puts every engine's processes (engine core and worker) on those cores
  and leaves the client (and redis-server) on ``--core``, as ``actor.engine_cpus`` does, or,
  listing ``--core`` too, lets the engines' threads use all of them beside the client;
  ``--rounds`` rounds of the arms in turn, every engine alive throughout, the start-up heap
  frozen as an actor freezes it (asyncrl/core/runtime/heap.py); ratios are medians of the per-round
  ratios. Each arm also records the CPU seconds of the client and of each child process by
  name (``CpuMeter``). ``--model`` (a preset such as ``smollm2``, or any ``model.path``:
  benchmarks/real_model.py) measures a real model; on the demo's addition task it gets
  examples/smollm2_math's chat prompts and the math-verify reward instead. ``--dtypes``
  (default: ``model.dtype``) measures each dtype's arms in the same rounds, and each arm's
  ratio to the first dtype's. The JSON's ``pinning`` and the console say how the processes
  and threads were pinned; a plot of every round goes next to the JSON.
own: the actor's own CPU per group, with no model: ``Actor.produce`` (everything the actor
  arm does but vLLM) over ``asyncrl.actors.engine.sim.SimEngine`` at 1e9 tokens/s, so completions of
  the demo's mean length come back at once, into a real redis-server; ``--prompts`` groups per
  round (default 1000 here), ``--rounds`` rounds; CPU ms per group of the client and of
  redis-server, all on ``--core``. Not part of ``all``.
learner: seconds per step on one batch of demo-sized groups, under ``torchrun
  --nproc_per_node=--nproc``, of
  - bare:   FSDP2 forward + REINFORCE-style token loss + backward + AdamW step;
  - ours:   ``asyncrl.learner.compute.step.train_on_batch`` (advantages, registry loss, grad clip, metrics);
  - gather: ``asyncrl.learner.compute.model.full_named_tensors`` (what precedes every weight sync).
  For a real model's long-tailed batches against a hand-written loop, use
  ``benchmarks.learner.throughput --preset smollm2``.
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
from pathlib import Path

from benchmarks.common import REPO, RESULTS, write_result
from benchmarks.parts.overheads_actor import ARMS


def _config(args, extra: list[str], tmp: str, count: int):
    """``(config, model directory)``: ``--model``, ``extra``, then ``--set``. A model other
    than the demo, on the demo's addition task, gets ``count`` of examples/smollm2_math's
    chat prompts (``benchmarks.real_model.math_task``, written into ``tmp``) instead."""
    from benchmarks.real_model import is_demo, math_task, resolve_model_dir

    cfg, model_dir = resolve_model_dir(args.model, [*extra, *args.set])
    if not is_demo(cfg) and cfg.task.name == "addition":
        cfg, model_dir = resolve_model_dir(args.model, [*math_task(tmp, count), *extra, *args.set])
    return cfg, model_dir


def own_part(args) -> dict:
    """``Actor.produce`` over an instant ``SimEngine``: the actor's own work per group."""
    from asyncrl.actors.data.tasks import build_prompt_source
    from asyncrl.actors.engine.sim import SimEngine
    from asyncrl.buffer import codec
    from asyncrl.buffer.service.server import RedisServer
    from benchmarks.parts.overheads_actor import actor_round

    os.sched_setaffinity(0, {args.core})
    groups = args.prompts or 1000
    tmp = tempfile.TemporaryDirectory()
    cfg, model_dir = _config(args, [], tmp.name, groups)
    source = build_prompt_source(cfg, model_dir, lambda text: None)
    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    codec.warm_up()

    async def rounds(url: str) -> list[dict]:
        out = []
        for r in range(args.rounds):
            engine = SimEngine(vocab, 1e9, cfg.actor.sim_mean_len, seed=r)
            res = await actor_round(cfg, model_dir, engine, source, groups, url, f"own{r}")
            out.append(res)
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{k} {v:.3f}" for k, v in _per_group(res).items()) + " ms a group", flush=True)  # fmt: skip
        return out

    with tmp, RedisServer(tmp.name) as server:
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
            "completion_len_mean": statistics.median(r["completion_tokens"] / r["samples"]
                                                     for r in runs),
            "runs": runs}  # fmt: skip


def _dtype_block(arms: dict[str, list[dict]], prompts: int) -> dict:
    """One dtype's arms: summaries, each arm's ratio to bare vLLM (median of the per-round
    ratios) and where the CPU went."""
    out = {k: _summary(v) for k, v in arms.items()}
    bare = [r["tokens_per_s"] for r in arms["bare_vllm"]]
    for k in ("engine", "actor"):
        ratios = [r["tokens_per_s"] / b for r, b in zip(arms[k], bare, strict=True)]
        out[f"{k}_vs_bare_per_round"] = ratios
        out[f"{k}_vs_bare"] = statistics.median(ratios)
    for k, runs in arms.items():
        out[k]["client_cpu_share_median"] = statistics.median(
            r["client_cpu_s"] / r["seconds"] for r in runs)  # fmt: skip
        out[k]["children_cpu_ms_per_group_median"] = statistics.median(
            1000 * r["children_cpu_s"] / prompts for r in runs)  # fmt: skip
    return out


def _vs(arms: dict[str, list[dict]], ref: dict[str, list[dict]]) -> dict[str, float]:
    """Each arm's tokens/s against the same arm of ``ref``: medians of per-round ratios."""
    return {k: statistics.median(r["tokens_per_s"] / b["tokens_per_s"]
                                 for r, b in zip(v, ref[k], strict=True))
            for k, v in arms.items()}  # fmt: skip


def _say_actor(d: str, block: dict, rounds: int) -> None:
    med = {k: block[k]["tokens_per_s_median"] for k in ARMS}
    print(f"CPU, {d} (medians): " + ", ".join(
        f"{k}: client {block[k]['client_cpu_share_median']:.0%} of the wall time, child "
        f"processes (engine, redis-server, reward workers) "
        f"{block[k]['children_cpu_ms_per_group_median']:.1f} ms a group" for k in ARMS),
        flush=True)  # fmt: skip
    print(f"actor, {d} ({rounds} interleaved rounds, medians): bare vLLM "
          f"{med['bare_vllm']:.0f} tok/s, ActorEngine {med['engine']:.0f} tok/s "
          f"({block['engine_vs_bare']:.2f}x), Actor {med['actor']:.0f} tok/s "
          f"({block['actor_vs_bare']:.2f}x; median of per-round ratios); mean completion "
          f"{block['actor']['completion_len_mean']:.0f} tokens", flush=True)  # fmt: skip


def actor_part(args) -> dict:
    from asyncrl.buffer.service.server import RedisServer
    from asyncrl.core.config.checks import parse_cores
    from benchmarks.parts.overheads_actor import interleaved, pinning, task_prompts

    # --engine-core: vLLM's engine core and worker there; the client on --core, apart unless
    # --core is one of them (default: everything on --core)
    engine_cores = parse_cores(args.engine_core) if args.engine_core else [args.core]
    os.sched_setaffinity(0, {args.core, *engine_cores})
    bind = ",".join(map(str, engine_cores))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind  # bare LLM binds like the actor
    count = args.prompts or 256
    with tempfile.TemporaryDirectory() as tmp:
        cfg, model_dir = _config(args, [f"actor.cpu_bind='{bind}'"], tmp, count)
        source, prompts = task_prompts(cfg, model_dir, count)
        dtypes = args.dtypes.split(",") if args.dtypes else [cfg.model.dtype]
        with RedisServer(tmp) as server:
            # with the client, unless --redis-core sets the buffer apart as a service
            os.sched_setaffinity(
                server.pid, {args.core if args.redis_core is None else args.redis_core}
            )
            apart = None if args.core in engine_cores else engine_cores
            runs = asyncio.run(interleaved(cfg, model_dir, source, prompts, server.url,
                                           args.rounds, dtypes, apart))  # fmt: skip
    pins = pinning(args.core, engine_cores, args.redis_core, cfg.actor.cpu_threads)
    print(f"pinned: {pins['layout']}; vLLM's OMP threads bound to {bind}; the client's torch "
          f"threads {pins['client_torch_threads']}; redis-server on core {pins['redis_core']}",
          flush=True)  # fmt: skip
    from asyncrl.core.config.job import engine_batch

    a, s, first = cfg.actor, cfg.sampling, dtypes[0]
    out = {"model": cfg.model.path, "task": cfg.task.name, "prompts": len(prompts),
           "prompt_tokens_mean": statistics.fmean(map(len, prompts)),
           "sampling": {"n": s.n_samples, "max_tokens": s.max_tokens,
                        "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k,
                        "max_inflight": a.max_inflight, "engine_batch": engine_batch(cfg)},
           "core": args.core, "redis_core": args.redis_core, "engine_core": args.engine_core,
           "pinning": pins, "rounds": args.rounds, "dtype": first}  # fmt: skip
    blocks = {d: _dtype_block(runs[d], len(prompts)) for d in dtypes}
    out |= blocks[first]  # the first dtype's arms at the top, as before --dtypes
    for d in dtypes[1:]:
        blocks[d]["vs_first_dtype"] = _vs(runs[d], runs[first])
    if len(dtypes) > 1:
        out["other_dtypes"] = {d: blocks[d] for d in dtypes[1:]}
    for d in dtypes:
        _say_actor(d, blocks[d], args.rounds)
    for d in dtypes[1:]:
        print(f"{d} against {first} (medians of per-round ratios): " + ", ".join(
            f"{k} {v:.2f}x" for k, v in blocks[d]["vs_first_dtype"].items()), flush=True)  # fmt: skip
    return out


def plot_actor(res: dict, path: Path) -> None:
    """Tokens/s of every arm and dtype: each round a dot, the median a bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocks = {res["dtype"]: res, **res.get("other_dtypes", {})}
    fig, ax = plt.subplots(figsize=(2.2 + 2.4 * len(blocks), 3.4))
    for i, (d, block) in enumerate(blocks.items()):
        for j, arm in enumerate(ARMS):
            x = 4 * i + j
            ax.bar(x, block[arm]["tokens_per_s_median"], color=f"C{j}",
                   label=arm if i == 0 else None)  # fmt: skip
            ax.plot([x] * len(block[arm]["tokens_per_s"]), block[arm]["tokens_per_s"], "k.")
        ax.text(4 * i + 1, 0, f"{d}\nactor {block['actor_vs_bare']:.2f}x", ha="center",
                va="bottom", fontsize=8, color="white")  # fmt: skip
    ax.set_xticks([4 * i + 1 for i in range(len(blocks))], list(blocks))
    ax.set_ylabel("completion tokens/s")
    ax.set_title(f"{Path(res['model']).name}: {res['pinning']['layout']}", fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def learner_part(args) -> dict:
    from asyncrl.core.runtime.torchrun import free_port as _free_port
    from benchmarks.real_model import model_overrides

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "learner.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.nproc}",
               f"--master_port={_free_port()}", "--master_addr=127.0.0.1", "-m",
               "benchmarks.learner.overheads", "--out", str(out), "--repeat", str(args.repeat),
               *(f"--set={kv}" for kv in [*model_overrides(args.model), *args.set])]  # fmt: skip
        env = dict(os.environ, OMP_NUM_THREADS="1")
        subprocess.run(cmd, cwd=REPO, env=env, check=True, timeout=1200)
        res = json.loads(out.read_text())
    print(f"learner ({args.nproc} ranks): bare FSDP2 step {res['bare']['median_s']:.3f} s, "
          f"train_on_batch {res['ours']['median_s']:.3f} s "
          f"({res['ours']['median_s'] / res['bare']['median_s']:.2f}x), full-weight gather "
          f"{res['gather']['median_s']:.4f} s", flush=True)  # fmt: skip
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.parts.overheads")
    p.add_argument("part", nargs="?", choices=["actor", "learner", "own", "all"], default="all")
    p.add_argument("--prompts", type=int, default=None,
                   help="prompts (groups) per run: actor 256, own 1000 by default")  # fmt: skip
    p.add_argument("--core", type=int, default=1, help="core for the actor measurements")
    p.add_argument("--engine-core", default=None, metavar="CORES",
                   help="actor part: vLLM's engine core and worker (every engine's) on these "
                        "cores (e.g. 1, or 0-1), the client on --core, apart unless --core is "
                        "one of them (default: all on --core)")  # fmt: skip
    p.add_argument("--redis-core", type=int, default=None,
                   help="actor part: pin redis-server to this core (default: --core, with "
                        "everything else)")  # fmt: skip
    p.add_argument("--nproc", type=int, default=2, help="learner ranks")
    p.add_argument("--repeat", type=int, default=10, help="learner steps timed per arm")
    p.add_argument("--rounds", type=int, default=5,
                   help="interleaved rounds of the actor part's three arms")  # fmt: skip
    p.add_argument("--name", default="micro_overheads")
    p.add_argument("--out", type=Path, default=RESULTS, help="directory for the JSON")
    p.add_argument("--model", default=None,
                   help="a model preset (configs/model: demo, smollm2) or any model.path; "
                        "default: the config's (the demo)")  # fmt: skip
    p.add_argument("--dtypes", default=None,
                   help="actor part: vLLM dtypes measured side by side, e.g. "
                        "float32,bfloat16 (default: model.dtype)")  # fmt: skip
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
    path = write_result(name, {"config": config, "results": results}, args.out)
    if "actor" in results:
        plot_actor(results["actor"], path.with_suffix(".png"))
    print(f"wrote {path}" + (f" and {path.with_suffix('.png').name}" if "actor" in results else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
