"""Peak memory and time of one forward+backward of ``token_logprobs``: full-vocabulary logits
against log-probs from the hidden states in chunks, and chunks with per-layer gradient
checkpointing, on a random Qwen2 with Qwen2.5's 151,936-token vocabulary.

    python -m benchmarks.learner.logprob_memory            # ~3 min here; results/logprob_memory.json

Arms, side by side in one run, each in a fresh subprocess (one arm's freed memory cannot
hide another's peak), ``--rounds`` (2) interleaved rounds of ``--repeat`` (2) steps each: ``full`` (``model.logprob_chunk_tokens=0``: the whole [B, L, V]
logits, the path before chunking), ``chunked`` (``--chunk`` positions per chunk, 256 by
default so that this CPU-sized batch of ~1.1k real tokens spans several chunks, as a GPU
micro-batch of 32k tokens spans many chunks of the default 1024), and ``chunked+ckpt``
(with ``model.gradient_checkpointing``); ``--arms`` adds ``full+ckpt``. Every arm scores the
same seeded long-tailed batch with the same loss (log-probs and entropy weighted by fixed
random numbers).

Peak memory: the process's resident-set high-water mark during the timed steps above its
level just before them (Linux: writing 5 to ``/proc/self/clear_refs`` resets the mark,
``VmHWM`` reads it); the parameter gradients are allocated before, so the figure is the
step's activations, logits and temporaries. Threads: one torch/OpenMP thread per arm
(``torch.set_num_threads(1)``, ``OMP_NUM_THREADS=1``), the arm's process pinned to one core
(``--core``, default the last usable one). CPU only: GPU figures are not measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

from benchmarks.common import REPO, md_table, write_result

ARMS = {  # name: (chunked, gradient_checkpointing)
    "full": (False, False),
    "chunked": (True, False),
    "chunked+ckpt": (True, True),
    "full+ckpt": (False, True),  # not run by default (--arms): the slowest, and says little
}
DEFAULT_ARMS = "full,chunked,chunked+ckpt"
SHAPE = {  # a Qwen2 small enough to step in seconds on one core, with Qwen2.5's vocabulary
    "vocab_size": 151_936,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
}


def batch_lengths(rows: int, max_len: int, seed: int) -> list[int]:
    """Long-tailed row lengths: a quarter-length prompt plus an exponential completion
    (mean a quarter of ``max_len``), capped at ``max_len``; the longest row is ``max_len``."""
    import random

    rng = random.Random(seed)
    prompt = max_len // 4
    lengths = [min(max_len, prompt + 1 + int(rng.expovariate(4 / max_len))) for _ in range(rows)]
    lengths[0] = max_len
    return lengths


def _rss_kib() -> dict[str, int]:
    status = open("/proc/self/status").read()
    return {k: int(re.search(rf"{k}:\s+(\d+)", status).group(1)) for k in ("VmRSS", "VmHWM")}


def run_arm(arm: str, rows: int, max_len: int, chunk_tokens: int, repeat: int, seed: int) -> dict:
    """One arm in this process: build, reset the RSS high-water mark, time ``repeat`` steps."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from asyncrl.learner.compute.model import enable_gradient_checkpointing, token_logprobs

    chunked, ckpt = ARMS[arm]
    chunk = chunk_tokens if chunked else 0
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPE, use_cache=False)).train()
    if ckpt:
        enable_gradient_checkpointing(model)
    lengths = batch_lengths(rows, max_len, seed)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, SHAPE["vocab_size"], (rows, max_len), generator=g)
    mask = (torch.arange(max_len)[None] < torch.tensor(lengths)[:, None]).long()
    w_lp, w_ent = torch.randn(2, rows, max_len - 1, generator=g) * mask[:, 1:]

    def step():
        lp, ent = token_logprobs(model, ids * mask, mask, chunk_tokens=chunk)
        ((lp * w_lp).sum() + 0.01 * (ent * w_ent).sum()).backward()

    for param in model.parameters():  # allocated now, so the peak is the step's own memory
        param.grad = torch.zeros_like(param)
    open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
    base = _rss_kib()["VmRSS"]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=False)
    return {"times_s": times, "peak_mib": (_rss_kib()["VmHWM"] - base) / 1024,
            "rss_before_mib": base / 1024, "load_avg_1min": os.getloadavg()[0]}  # fmt: skip


def _run_child(args, arm: str) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.learner.logprob_memory", "--arm", arm, "--rows",
           str(args.rows), "--max-len", str(args.max_len), "--chunk", str(args.chunk),
           "--repeat", str(args.repeat), "--seed", str(args.seed), "--core", str(args.core)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _summary(arm: str, chunk: int, runs: list[dict]) -> dict:
    chunked, ckpt = ARMS[arm]
    times = [t for r in runs for t in r["times_s"]]
    return {
        "chunk_tokens": chunk if chunked else 0,
        "gradient_checkpointing": ckpt,
        "step_s_median": statistics.median(times),
        "step_s_min": min(times),
        "peak_step_mib": max(r["peak_mib"] for r in runs),
        "runs": runs,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--chunk", type=int, default=256, help="chunked arms' logprob_chunk_tokens")
    p.add_argument("--repeat", type=int, default=2, help="timed steps per arm and round")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds of all arms")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arms", default=DEFAULT_ARMS, help=f"any of {','.join(ARMS)}")
    p.add_argument("--core", type=int, default=max(os.sched_getaffinity(0)))
    p.add_argument("--arm", help=argparse.SUPPRESS)  # internal: run one arm, print its JSON
    args = p.parse_args()
    if args.arm:
        os.sched_setaffinity(0, {args.core})
        res = run_arm(args.arm, args.rows, args.max_len, args.chunk, args.repeat, args.seed)
        return print(json.dumps(res))
    arms = args.arms.split(",")
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    for _ in range(args.rounds):  # interleaved: machine noise hits every arm alike
        for arm in arms:
            runs[arm].append(_run_child(args, arm))
            print(arm, runs[arm][-1], flush=True)
    results = {arm: _summary(arm, args.chunk, r) for arm, r in runs.items()}
    lengths = batch_lengths(args.rows, args.max_len, args.seed)
    logits_mib = args.rows * (args.max_len - 1) * SHAPE["vocab_size"] * 4 / 2**20
    config = {"model": SHAPE, "rows": args.rows, "max_len": args.max_len, "lengths": lengths,
              "real_tokens": sum(lengths), "padded_tokens": args.rows * args.max_len,
              "chunk_tokens": args.chunk, "repeat": args.repeat, "rounds": args.rounds,
              "seed": args.seed, "threads": 1, "core": args.core,
              "one_float32_logits_tensor_mib": logits_mib}  # fmt: skip
    path = write_result("logprob_memory", {"config": config, "arms": results})
    table = [[arm, r["chunk_tokens"], r["gradient_checkpointing"], r["peak_step_mib"],
              r["step_s_median"]] for arm, r in results.items()]  # fmt: skip
    print(md_table(["arm", "chunk", "ckpt", "peak MiB", "step s (median)"], table))
    print(f"one [B, L-1, V] float32 tensor: {logits_mib:.0f} MiB; wrote {path}")


if __name__ == "__main__":
    main()
