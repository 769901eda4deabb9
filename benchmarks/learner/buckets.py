"""CPU proxy for the learner's padding waste: the padded path vs length-bucketed micro-batches.

One process, one long-tailed batch, the demo model's architecture (asyncrl's own demo-model
code, random weights; ``max_position_embeddings`` raised to fit the rows), the default
algorithm preset. Arms, timed in interleaved rounds so machine noise hits them alike:

  padded          ``learner.micro_batch_rows=0``: every row padded to the batch's longest
                  (the cpu preset);
  bucketed_<N>    ``learner.max_tokens_per_micro_batch=N``: rows sorted by length, packed
                  into micro-batches of at most N padded tokens, each trimmed to its longest.

Reported per arm: median step time, real tokens/s (prompt + completion tokens of the batch
per step second), the padded-token fraction of what the forwards processed (the step's
``padding_frac``), micro-batches per update, the first step's loss and gradient norm from the
same initial weights (they must agree: the update is the same), and peak RSS of one step in a
fresh process (the kernel's ``VmHWM``, which exec resets, unlike ``getrusage``'s maxrss;
``--no-memory`` to skip). Threads are pinned:
``torch.set_num_threads(--threads)`` (default 1) in every process, and ``--core C`` binds
the process to one core (``os.sched_setaffinity``); both are in the JSON.

The batch mirrors the GPU presets' H100 batch scaled by 1/16: 16 groups x 8 samples, a 16-token
prompt, completions ~ Exp(mean 44) capped at 192 (there: 256, mean 700, cap 3,072). GPU
timing is not measured here.

    python -m benchmarks.learner.buckets            # ~1-2 min on 2 shared cores
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, RESULTS, md_table, write_result


def build_batch(args):
    """The long-tailed batch: ``groups x n`` rows of ``prompt + min(cap, 1 + Exp(mean))``."""
    from asyncrl.core.types import Group, Sample
    from asyncrl.learner.compute.batch import collate

    rng = random.Random(args.seed)
    vocab = 64  # the demo tokenizer's ids
    groups = []
    for g in range(args.groups):
        prompt = [rng.randrange(1, vocab) for _ in range(args.prompt)]
        samples = []
        for _ in range(args.n):
            c = min(args.cap, 1 + int(rng.expovariate(1 / args.mean)))
            samples.append(Sample(prompt, [rng.randrange(1, vocab) for _ in range(c)],
                                  [-rng.uniform(0.5, 4.0) for _ in range(c)], [0] * c,
                                  float(rng.random() < 0.5)))  # fmt: skip
        groups.append(Group(f"g{g}", g, 0, samples))
    return collate(groups)


def build_model_dir(args, out: Path) -> Path:
    from asyncrl.orchestration.demo.model import demo_config, init_model, save_model_dir

    cfg = demo_config(num_layers=args.layers, hidden_size=args.hidden,
                      max_position_embeddings=args.prompt + args.cap + 1)  # fmt: skip
    return save_model_dir(init_model(cfg, seed=args.seed), out)


def context(model_dir: Path, budget: int, cap: int):
    """A fresh policy (same seed, same weights for every arm), AdamW, the default algorithm."""
    import torch

    from asyncrl.core.config.load import load_config
    from asyncrl.learner.compute.model import build_policy
    from asyncrl.learner.compute.step import StepContext

    cfg = load_config([])
    torch.manual_seed(0)
    model = build_policy(model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.learner.lr)
    return StepContext(model, opt, cfg.algorithm, 0, 1, cfg.learner.grad_clip,
                       max_tokens=cap, max_tokens_per_micro_batch=budget)  # fmt: skip


def pin(args) -> dict:
    """One intra-op thread (``--threads``), optionally one core (``--core``)."""
    import torch

    torch.set_num_threads(args.threads)
    if args.core is not None:
        os.sched_setaffinity(0, {args.core})
    return {"torch_threads": torch.get_num_threads(), "cores": sorted(os.sched_getaffinity(0))}


def probe(args) -> None:
    """One step of one arm in this fresh process; prints RSS before and after as JSON."""
    from asyncrl.learner.compute.step import train_on_batch

    pin(args)
    batch = build_batch(args)
    ctx = context(Path(args.model_dir), args.probe, args.cap)
    before = _peak_rss_mib()
    train_on_batch(ctx, batch)
    print(json.dumps({"peak_rss_before_step_mib": before, "peak_rss_mib": _peak_rss_mib()}))


def _peak_rss_mib() -> float:
    """This process's peak resident memory (``VmHWM``; Linux keeps ``ru_maxrss`` across exec,
    so a child would report its parent's peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def peak_memory(args, model_dir: Path, budget: int) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.learner.buckets", "--probe", str(budget),
           "--model-dir", str(model_dir), *sys.argv[1:]]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--n", type=int, default=8, help="samples per group")
    p.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    p.add_argument("--mean", type=float, default=44.0, help="mean completion tokens")
    p.add_argument("--cap", type=int, default=192, help="completion cap")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--budgets", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--core", type=int, default=None, help="bind to this core")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--out", default=str(RESULTS), help="results directory")
    p.add_argument("--probe", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    return p.parse_args()


def measure(args, batch) -> dict[str, dict]:
    """Each arm's first step (its metrics) and ``args.repeat`` interleaved timed steps, and
    its peak RSS in a fresh process: arm name -> results, ratios against ``padded``."""
    from asyncrl.learner.compute.step import train_on_batch

    real = int(batch.attention_mask.sum())
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-") as tmp:
        model_dir = build_model_dir(args, Path(tmp))
        arms = {"padded": 0, **{f"bucketed_{b}": b for b in args.budgets}}
        ctxs = {name: context(model_dir, b, args.cap) for name, b in arms.items()}
        first = {name: train_on_batch(ctx, batch) for name, ctx in ctxs.items()}  # + warm-up
        times: dict[str, list[float]] = {name: [] for name in arms}
        for _ in range(args.repeat):
            for name, ctx in ctxs.items():
                t0 = time.perf_counter()
                train_on_batch(ctx, batch)
                times[name].append(time.perf_counter() - t0)
        memory = {}
        if not args.no_memory:
            memory = {name: peak_memory(args, model_dir, b) for name, b in arms.items()}
    results = {}
    for name in arms:
        step_s = statistics.median(times[name])
        results[name] = {
            "budget_tokens": arms[name],
            "step_s_median": step_s,
            "step_s_all": times[name],
            "real_tokens_per_s": real / step_s,
            "padding_frac": first[name]["padding_frac"],
            "micro_batches": first[name]["micro_batches"],
            "micro_batch_tokens_max": first[name]["micro_batch_tokens_max"],
            "first_step_loss": first[name]["loss"],
            "first_step_grad_norm": first[name]["grad_norm"],
            **memory.get(name, {}),
        }
    base = results["padded"]
    for r in results.values():
        r["tokens_per_s_vs_padded"] = r["real_tokens_per_s"] / base["real_tokens_per_s"]
        r["loss_diff_vs_padded"] = abs(r["first_step_loss"] - base["first_step_loss"])
    return results


def report(args, batch, results: dict[str, dict], pinned, wall_s: float) -> None:
    """Write the JSON result and print the table."""
    real = int(batch.attention_mask.sum())
    lengths = batch.attention_mask.sum(-1)
    config = {k: v for k, v in vars(args).items() if k not in ("probe", "model_dir", "out")}
    width = int(batch.input_ids.shape[1])
    payload = {
        "config": {
            **config,
            "pinned": pinned,
            "algorithm": "default preset (grpo)",
            "model": "demo architecture (asyncrl.orchestration.demo.model), random weights",
        },
        "batch": {
            "rows": batch.num_rows,
            "width": width,
            "real_tokens": real,
            "padded_tokens": batch.num_rows * width,
            "row_len_mean": float(lengths.float().mean()),
            "row_len_max": int(lengths.max()),
        },
        "arms": results,
        "wall_s": wall_s,
        "notes": "CPU only; GPU timing is not measured here. Peak RSS: one step of each arm "
        "in a fresh process (model, optimizer and batch included).",
    }
    path = write_result("learner_buckets", payload, Path(args.out))
    header = ["arm", "step s", "real tok/s", "x padded", "padding", "micro-batches", "peak RSS MiB"]
    rows = [[name, r["step_s_median"], r["real_tokens_per_s"], r["tokens_per_s_vs_padded"],
             r["padding_frac"], r["micro_batches"], r.get("peak_rss_mib")]
            for name, r in results.items()]  # fmt: skip
    print(md_table(header, rows))
    print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")


def main() -> None:
    args = parse_args()
    if args.probe is not None:
        return probe(args)
    t_start = time.monotonic()
    pinned = pin(args)
    batch = build_batch(args)
    results = measure(args, batch)
    report(args, batch, results, pinned, time.monotonic() - t_start)


if __name__ == "__main__":
    main()
