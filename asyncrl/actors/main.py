"""Actor process entry point: ``python -m asyncrl.actors.main --run-dir RUN --model-dir M --actor-id I``.

The buffer URL comes from ``ASYNCRL_REDIS_URL`` (kept out of argv: it carries a password).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from asyncrl.core.runtime.rundir import write_atomic

if TYPE_CHECKING:
    from asyncrl.buffer.faces import ActorBuffer


async def run(cfg, actor_id: int, model_dir: str, url: str) -> int:
    from asyncrl.actors.actor import Actor
    from asyncrl.actors.data import identity as data_identity
    from asyncrl.actors.data.tasks import build_prompt_source
    from asyncrl.actors.rewards.loading import check_signature, load_reward_fn, preflight
    from asyncrl.actors.rewards.scoring import RewardErrorRate
    from asyncrl.buffer.connection import BufferUnavailable, connect
    from asyncrl.buffer.redis_buffer import BufferOptions, ReplayBuffer
    from asyncrl.core.net.control import ControlClient
    from asyncrl.core.runtime.faults import failpoint
    from asyncrl.core.runtime.heap import freeze_startup_heap

    b = cfg.buffer
    say = lambda text: print(f"[actor {actor_id}] {text}", flush=True)  # noqa: E731
    prompts = build_prompt_source(cfg, model_dir, say)  # a dataset: loaded whole, filtered
    reward_fn = load_reward_fn(cfg.task.reward_fn)
    check_signature(reward_fn, prompts.get(0).fields, cfg.task.reward_fn)  # as the launcher
    preflight(reward_fn)  # e.g. no sandbox for model-written code: fail now, not score 0
    failpoint("actor.start", actor_id=actor_id)  # tests: an actor that dies at start
    buffer = ReplayBuffer(
        connect(url, timeout_s=b.reconnect_s, say=say),  # a restart may meet Redis away
        b.name,
        b.capacity,
        BufferOptions(lease_ttl_s=b.lease_ttl_s, reconnect_s=b.reconnect_s),
    )
    # the data the buffer's prompt cursors count in: FatalError if it changed since they began
    data_identity.check(buffer, data_identity.identity(cfg, prompts), say)
    engine = await _start_engine(cfg, actor_id, model_dir)
    actor = Actor(cfg, actor_id, model_dir, buffer, engine, prompts, reward_fn)
    try:
        await actor.groups.start()  # episode.agent: its endpoint listens before any episode
    except BaseException:
        await engine.shutdown()
        raise
    freeze_startup_heap()  # what the engine's start built, too (asyncrl/core/runtime/heap.py)
    validator = _validator(cfg, actor, model_dir, say)
    _serve_metrics(cfg, actor, buffer)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: setattr(actor.state, "stop", True))
    buffer.stop = lambda: actor.state.stop  # a stopping actor does not wait for Redis
    endpoint = await _meet_learner(cfg, actor, buffer, say)
    if endpoint is None:  # told to stop first
        await actor.groups.close()
        await engine.shutdown()
        return 0
    say(f"engine ready; learner control plane at {endpoint.address}")
    client = ControlClient(endpoint, actor_id)
    failed = None
    try:
        await asyncio.gather(actor.control_loop(client), actor.produce(), *validator)
    except RewardErrorRate as e:  # a broken reward: exit non-zero, saying so, with the stats
        failed = e
    except BufferUnavailable as e:
        if not actor.state.stop:
            raise
        # told to stop while Redis was gone (its launcher died with it): leave now; the
        # leases it held expire after buffer.lease_ttl_s
        print(f"[actor {actor_id}] stopping without Redis: {e}", flush=True)
    finally:
        client.close()
        actor.scorer.close()  # kills reward worker processes (and a call stuck in one)
        await actor.groups.close()  # the agent endpoint, then environment / agent processes
        await engine.shutdown()
    return _report(cfg, actor, failed, say)


async def _meet_learner(cfg, actor, buffer: ActorBuffer, say):
    """The learner's control-plane endpoint, once it announced itself in the buffer (bounded
    by ``actor.learner_wait_s``); None if the actor was told to stop first."""
    from asyncrl.actors.actor import wait_for_learner
    from asyncrl.core.runtime.waiting import StopRequested, Wait

    wait = Wait(
        f"a learner to announce itself in buffer {cfg.buffer.name!r}",
        cfg.actor.learner_wait_s,
        say,
        lambda: actor.state.stop,
        hint="start `asyncrl launch learner` with the same buffer.url and buffer.name, or "
        "raise actor.learner_wait_s",
    )
    try:
        return await wait_for_learner(buffer, wait, cfg.buffer.admission)
    except StopRequested as e:
        say(str(e))
        return None


def _report(cfg, actor, failed: Exception | None, say) -> int:
    """Write ``actor<i>.json``, say how the actor ended; 1 (recorded as fatal) if ``failed``."""
    from asyncrl.core.runtime import fatal

    s = actor.state
    stats_path = Path(cfg.run_dir) / f"actor{s.actor_id}.json"
    write_atomic(stats_path, json.dumps(actor.stats(), indent=2), 0o644)  # never half-written
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(s.reward_errors_by_kind.items()))
    say(
        f"{'stopped' if failed else 'done'}: committed {s.committed} groups, "
        f"duplicates {s.duplicates}, reward errors {s.reward_errors}"
        f"{f' ({kinds})' if kinds else ''}, final weights v{s.version} "
        f"({s.weight_syncs} syncs, {s.weight_sync_failures} failed)"
    )
    if failed:
        say(f"FAILED: {failed}")
        fatal.record(cfg.run_dir, f"actor{s.actor_id}", failed)  # a restart would fail the same
        return 1
    return 0


async def _start_engine(cfg, actor_id: int, model_dir: str):
    """``new_engine``, then a thread warms pyarrow's lazy imports (``codec.warm_up``: ~0.6 s
    that would otherwise land in the first commit) while the actor meets its learner and
    generates its first groups. Not before: vLLM's processes may be forked from this one
    (``actor.cpu_start_method``), and a fork must not copy a thread's half-done import."""
    from asyncrl.buffer import codec

    engine = await new_engine(cfg, actor_id, model_dir)
    threading.Thread(target=codec.warm_up, name="pyarrow-warm-up", daemon=True).start()
    return engine


async def new_engine(cfg, actor_id: int, model_dir: str, lora: dict | None = None):
    """vLLM (``actor.engine=vllm``) or the model-free simulator (``sim``). ``lora``: the
    engine's LoRA options in place of the config's (``_lora_options``); ``{}`` = none
    (``asyncrl eval``, which never syncs, passes its checkpoint's adapter or nothing)."""
    a = cfg.actor
    if a.engine == "sim":
        from asyncrl.actors.engine.sim import SimEngine

        vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
        return SimEngine(vocab, a.sim_tokens_per_s, a.sim_mean_len, seed=cfg.seed + actor_id)
    from asyncrl.actors.data.tasks import max_model_len
    from asyncrl.actors.engine.vllm_engine import ActorEngine
    from asyncrl.core.config.checks import parse_cores
    from asyncrl.core.config.job import engine_batch

    # ~7 s on one CPU core, minutes for a large model on a GPU (tests/e2e/test_interrupt.py
    # waits for this line)
    print(f"[actor {actor_id}] starting the vLLM engine ({model_dir})", flush=True)

    return await ActorEngine.start(
        model_dir,
        dtype=cfg.model.dtype,
        max_model_len=max_model_len(cfg),
        kv_cache_bytes=int(a.kv_cache_gib * 2**30) or None,  # 0 = vLLM sizes it
        gpu_memory_utilization=a.gpu_memory_utilization,
        tensor_parallel_size=a.tensor_parallel_size,
        enable_prefix_caching=a.prefix_caching,
        enforce_eager=a.enforce_eager,
        seed=cfg.seed + actor_id,
        cpu_bind=a.cpu_bind or None,
        torch_threads=a.cpu_threads,
        max_num_seqs=engine_batch(cfg),
        cpu_start_method=a.cpu_start_method,
        engine_cpus=parse_cores(a.engine_cpus) or None,
        **(_lora_options(cfg) if lora is None else lora),
    )


def _lora_options(cfg) -> dict:
    """``model.lora.sync=adapter``: vLLM with LoRA on, each weight version its own adapter
    (asyncrl/actors/engine/adapters.py); up to ``max_staleness + 2`` of them in one batch
    (requests in flight keep theirs; at most 8)."""
    lora = cfg.model.lora
    if not lora.adapter_sync:
        return {}
    from asyncrl.actors.engine.adapters import Adapters

    return {
        "adapters": Adapters(lora.rank, lora.alpha),
        "lora_rank": lora.rank,
        "max_loras": min(8, cfg.buffer.max_staleness + 2),
    }


def _validator(cfg, actor, model_dir: str, say) -> list:
    """``[Validator.run()]`` when ``eval`` validates (it publishes the set's size in the
    buffer meta, ``val_prompts``, for the learner), else ``[]``."""
    from asyncrl.actors.data.tasks import build_val_source
    from asyncrl.actors.validation import Validator, validation_size
    from asyncrl.buffer.eval_queue import EvalQueue

    source = build_val_source(cfg, model_dir, say)
    if source is None:
        return []
    size = validation_size(cfg, source)
    actor.buffer.set_meta(val_prompts=size)
    say(f"validation set: {size} prompt(s), {cfg.eval.n_samples} sample(s) each")
    queue, episodes = EvalQueue(actor.buffer), actor.groups.eval_episodes  # None: single-turn
    return [Validator(actor, source, size, queue, episodes).run()]


def _serve_metrics(cfg, actor, buffer: ActorBuffer) -> None:
    from asyncrl.core.net.endpoints import register_endpoint
    from asyncrl.core.observe.metrics import role_port, serve

    aid = actor.state.actor_id
    port = serve(
        actor.metrics.registry, role_port(cfg.metrics_port, "actor", aid), cfg.network.metrics
    )
    if port:
        register_endpoint(buffer.client, cfg.buffer.name, f"actor{aid}", port, cfg.network)
        print(f"[actor {aid}] metrics on http://{cfg.network.metrics}:{port}/metrics", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="asyncrl.actors.main")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--actor-id", type=int, required=True)
    args = p.parse_args(argv)
    from asyncrl.core.runtime.heap import defer_collection

    defer_collection()  # until the engine is up: freeze_startup_heap in run()
    url = os.environ.get("ASYNCRL_REDIS_URL")
    if not url:
        print("actor: ASYNCRL_REDIS_URL is not set (the buffer's Redis URL)", file=sys.stderr)
        return 2
    from asyncrl.core.config.load import config_from_json
    from asyncrl.core.runtime import fatal
    from asyncrl.core.runtime.lifeline import enable_stack_dumps, watch_launcher

    watch_launcher()  # bounded even where a SIGTERM's handler cannot run (asyncrl/core/runtime/lifeline.py)
    enable_stack_dumps()  # kill -USR1 PID: every thread's stack in the log
    cfg = config_from_json((Path(args.run_dir) / "config.json").read_text())
    with fatal.recorded(args.run_dir, f"actor{args.actor_id}"):  # e.g. a damaged buffer
        return asyncio.run(run(cfg, args.actor_id, args.model_dir, url))


if __name__ == "__main__":
    sys.exit(main())
