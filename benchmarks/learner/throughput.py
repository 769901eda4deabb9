"""Learner throughput on a long-tailed RL batch: asyncrl's learner step, the padded path and a
bare hand-written loop, side by side in one run.

    python -m benchmarks.learner.throughput --preset qwen2.5-1.5b   # one GPU
    python -m benchmarks.learner.throughput --preset cpu --cores 1 --rounds 3   # 11 min here
    python -m benchmarks.learner.throughput --config path/to/config.json --groups 8
    python -m benchmarks.learner.throughput --preset smollm2 --cores 0 --no-fit   # real model

The model is a random one of a Hugging Face config's shape: a preset (the real Qwen2.5-0.5B,
1.5B and 7B shapes, hard-coded in ``benchmarks.learner.throughput_model``; ``cpu``: Qwen's
151,936-token vocabulary with a body small enough to step in seconds on 2 cores; ``tiny``: for
the smoke test) or ``--config``. It is saved as a local safetensors model directory (nothing
is downloaded). ``--model`` (a model preset or any ``model.path``: benchmarks/real_model.py;
the ``smollm2`` preset's default) takes a real model's directory, weights and all, instead.
Every learner arm builds its policy from it through asyncrl's own
``asyncrl.learner.trainer.build_step_context`` (the ``build_policy`` + AdamW the learner uses, FSDP2
over a one-rank process group as in a run) and steps with ``asyncrl.learner.compute.step.train_on_batch``,
under the default algorithm of ``asyncrl.core.config.load.load_config`` plus the arm's overrides.
The batch is ``groups x n`` rows from a seeded generator: a ``prompt``-token prompt per group,
completions ``min(cap, 1 + Exp(mean))``; a batch of k groups is always the first k groups of
the stream.

Arms (``--arms``; ``--arm NAME:key=value,...`` adds one: the ``asyncrl`` arm's overrides plus
these, later keys winning):
  padded   the old path: ``learner.micro_batch_rows=0`` (every row padded to the batch's
           longest, one forward/backward), ``model.logprob_chunk_tokens=0`` (full logits),
           no gradient checkpointing;
  asyncrl  ``learner.max_tokens_per_micro_batch=--budget`` (length-sorted token micro-batches;
           ``learner.pack_sequences`` at its default: packed into one stream each on a GPU,
           trimmed rows on the CPU), ``model.logprob_chunk_tokens=--chunk``, gradient
           checkpointing as the preset says (on for the GPU presets);
  bare     ``BareLoop`` in ``benchmarks.learner.throughput_worker``: the ~60-line loop a careful
           person writes by hand (``--arm bare_NAME:dtype=bfloat16,...`` adds another with
           its settings changed: ``dtype``, ``budget``, ``chunk``, ``checkpointing``).
Any arm may also set ``threads=N`` and ``cores=A-B`` (its worker's torch threads and cores,
instead of ``--threads`` and ``--cores``). GPU arms compute in bfloat16 (``model.dtype=
bfloat16``: float32 master weights, FSDP2 mixed precision; the bare loop: float32 weights under
``torch.autocast``), CPU arms in float32; ``--dtype`` sets it for every arm. Each learner arm's
reference is the bare arm of the same dtype, threads and cores (else ``bare``): its ratio is the
median of the per-round ratios of real tokens/s, and a preset's ``target_vs_bare`` is checked
against it.

Figures per arm, each measured in fresh processes (one per arm and round, ``--rounds``
interleaved rounds of a warm-up step and ``--repeat`` timed steps): real tokens/s (prompt +
completion tokens of the batch / median step time); MFU = 6 N x real tokens/s / peak, N the
parameter count (tied weights once; recomputation and attention's own FLOPs not counted),
against a stated peak (the published dense BF16 figure for H100 SXM and H200 SXM, 989.4
TFLOPS, or ``--peak-tflops``; otherwise null with the reason); peak memory
(``torch.cuda.max_memory_allocated`` on GPU; the worker process's ``VmHWM`` on CPU, model,
optimizer and batch included); the largest batch that fits (in groups: doubling from the
measured batch, then bisecting, each try one step in its own process so an out-of-memory
error cannot poison the rest; ``--fit-max-groups`` bounds it, ``--mem-limit-gib`` limits
the try's memory: ``RLIMIT_AS`` on CPU, a CUDA memory fraction on GPU; ``--no-fit`` skips it
and the JSON says so). Threads are pinned (``--threads``, ``--cores``) and stated in the JSON,
written by ``benchmarks.common.write_result`` to ``benchmarks/results/<name>.json``.

This module holds the command line, the run's plan (presets and flags resolved into the JSON's
config) and ``main``; the rest is in ``benchmarks.learner.throughput_model`` (presets, batch, model),
``throughput_worker`` (one arm in a worker process: ``--worker SPEC`` runs it),
``throughput_runner`` (the rounds and the largest-batch search) and ``throughput_report``
(figures, targets, table).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from benchmarks.common import RESULTS
from benchmarks.learner.throughput_model import (
    PRESETS,
    completion_lengths,
    model_config,
    real_tokens,
)
from benchmarks.learner.throughput_report import (
    batch_facts,
    first_of,
    library_versions,
    rounds_table,
    table,
    targets,
    write_and_print,
)
from benchmarks.learner.throughput_runner import run_arms
from benchmarks.learner.throughput_worker import worker_main
from benchmarks.real_model import model_overrides, resolve_model_dir

DEFAULT_ARMS = "padded,asyncrl,bare"
RUNNER_KEYS = ("threads", "cores")
"""Arm keys for the worker process, not for asyncrl or the bare loop."""


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help="default: qwen2.5-1.5b with a GPU, cpu without",
    )
    p.add_argument("--config", help="an HF config.json (or model dir) for the shape instead")
    p.add_argument(
        "--model",
        help="a real model instead of a random one: a preset (configs/model) or any model.path "
        "(default: the preset's, smollm2 for --preset smollm2)",
    )
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="compute dtype, every arm")
    for name, kind in (("groups", int), ("n", int), ("prompt", int), ("mean", float), ("cap", int),
                       ("floor", int)):  # fmt: skip
        p.add_argument(f"--{name}", type=kind, help="batch: override the preset's")
    p.add_argument("--budget", type=int, help="tokens per micro-batch (asyncrl, bare)")
    p.add_argument("--chunk", type=int, help="log-prob chunk positions (asyncrl, bare)")
    p.add_argument("--checkpointing", choices=["true", "false"], help="asyncrl and bare arms")
    p.add_argument("--arms", help=f"default: the preset's, else {DEFAULT_ARMS}")
    p.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="NAME:key=value,...",
        help="add an arm: the asyncrl arm's overrides plus these (bare*: the bare loop's "
        "settings); threads=N, cores=A-B: its worker's",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="key=value",
        help="an asyncrl override for every learner arm",
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every arm")
    p.add_argument("--repeat", type=int, default=2, help="timed steps per arm and round")
    p.add_argument(
        "--threads",
        type=int,
        help="torch threads per worker (default: 1 on CPU, all usable cores on GPU)",
    )
    p.add_argument("--cores", default="", help="bind every worker to these, e.g. 0-1")
    p.add_argument("--peak-tflops", type=float, help="peak for MFU (default: stated H100/H200)")
    p.add_argument(
        "--profile",
        default="",
        metavar="ARM,...",
        help="profile one extra step of these arms (torch.profiler; first round): the "
        "operators' tables in <out>/<name>_<arm>_profile.txt",
    )
    p.add_argument("--no-fit", action="store_true", help="skip the largest-batch search")
    p.add_argument("--fit-max-groups", type=int, help="upper bound of the search")
    p.add_argument("--fit-arms", help="search only these arms' largest batch (default: all)")
    p.add_argument(
        "--mem-limit-gib",
        type=float,
        help="memory limit of every fit try (cpu preset: 8; else none)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per worker process")
    p.add_argument("--work-dir", help="keep the random model here (default: a temp dir)")
    p.add_argument("--out", default=str(RESULTS), help="results directory")
    p.add_argument("--name", help="result name (default learner_throughput_<preset>)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def plan(args, cuda: bool) -> dict:
    """Everything the run uses, resolved from the preset and the flags: the JSON's config."""
    preset_name = args.preset or ("qwen2.5-1.5b" if cuda else "cpu")
    preset = PRESETS[preset_name]
    batch = {k: getattr(args, k) if getattr(args, k) is not None else v
             for k, v in preset["batch"].items()}  # fmt: skip
    pick = lambda flag, key: flag if flag is not None else preset.get(key)  # noqa: E731
    ckpt = pick(None if args.checkpointing is None else args.checkpointing == "true",
                "checkpointing")  # fmt: skip
    budget, chunk = pick(args.budget, "budget"), pick(args.chunk, "chunk")
    device, dtype = ("cuda", "bfloat16") if cuda else ("cpu", "float32")
    dtype = args.dtype or dtype
    model = args.model or (None if args.config else preset.get("model_path"))
    if model and args.config:
        raise SystemExit("--model and --config: a real model or a random one of a shape, not both")
    base = dict(kv.split("=", 1) for kv in model_overrides(model))  # the model preset's config
    base |= {"learner.device": device, "model.dtype": dtype, "sampling.max_tokens": batch["cap"]}
    base |= dict(kv.split("=", 1) for kv in args.set)
    asyncrl = {"learner.micro_batch_rows": 0, "learner.max_tokens_per_micro_batch": budget,
               "model.logprob_chunk_tokens": chunk,
               "model.gradient_checkpointing": ckpt}  # fmt: skip
    bare = {"budget": budget, "chunk": chunk, "checkpointing": ckpt, "lr": 2e-4,
            "grad_clip": 1.0, "clip_eps": 0.2, "dtype": dtype}  # fmt: skip
    arms, fit = plan_arms(args, preset, base, asyncrl, bare), plan_fit(args, preset, cuda)
    for flag, wanted in (("--fit-arms", (fit or {}).get("arms") or []),
                         ("--profile", [a for a in args.profile.split(",") if a])):  # fmt: skip
        unknown = [a for a in wanted if a not in arms]
        if unknown:
            raise SystemExit(
                f"{flag} {','.join(unknown)}: not an arm of this run ({', '.join(arms)})"
            )
    name = result_name(args, None if args.config else preset_name)
    profile = {a: f"{name}_{a}_profile.txt" for a in args.profile.split(",") if a}
    return {
        "preset": None if args.config else preset_name,
        "batch_preset": preset_name,
        "config_file": args.config,
        "real_model": model,
        "device": device,
        "dtype": dtype,
        "batch": batch,
        "budget_tokens": budget,
        "chunk_tokens": chunk,
        "gradient_checkpointing": ckpt,
        "arms": arms,
        "target_vs_bare": preset.get("target_vs_bare"),
        "rounds": args.rounds,
        "repeat": args.repeat,
        "seed": args.seed,
        "fit": fit,
        "name": name,
        "profile": profile,
        "algorithm": "default (asyncrl.core.config.load.load_config: grpo, decoupled_ppo, token_mean)",
    }


def plan_arms(args, preset: dict, base: dict, asyncrl: dict, bare: dict) -> dict:
    """``--arms`` then each ``--arm``, in order: a learner arm's overrides (``base``, then the
    arm's own) or a bare loop's settings (``bare``, then the arm's own), and the worker's
    ``threads``/``cores`` where the arm sets them."""
    learner_arms = {
        "padded": {"learner.micro_batch_rows": 0, "learner.max_tokens_per_micro_batch": 0,
                   "model.logprob_chunk_tokens": 0, "model.gradient_checkpointing": False},
        "asyncrl": asyncrl,
    }  # fmt: skip
    bare_arms, runner = {"bare": bare}, {}
    for text in args.arm:
        name, _, kvs = text.partition(":")
        extra = dict(kv.split("=", 1) for kv in kvs.split(",") if kv)
        runner[name] = {k: extra.pop(k) for k in RUNNER_KEYS if k in extra}
        if name.startswith("bare"):
            bare_arms[name] = {**bare, **{k: _typed(bare, k, v) for k, v in extra.items()}}
        else:
            learner_arms[name] = {**learner_arms["asyncrl"], **extra}
    listed = args.arms or preset.get("arms", DEFAULT_ARMS)
    names = [a for a in listed.split(",") if a] + [t.partition(":")[0] for t in args.arm]
    arms = {}
    for name in dict.fromkeys(names):
        if name in bare_arms:
            arms[name] = {"kind": "bare", "settings": bare_arms[name]}
        elif name in learner_arms:
            ov = {**base, **learner_arms[name]}
            arms[name] = {"kind": "learner", "overrides": [f"{k}={_val(v)}" for k, v in ov.items()]}
        else:
            raise SystemExit(f"unknown arm {name!r}: padded, asyncrl, bare or one given by --arm")
        arms[name] |= runner.get(name, {})
    return arms


def _typed(bare: dict, key: str, text: str):
    """``text`` as the type of the bare loop's setting ``key`` (SystemExit for an unknown key)."""
    if key not in bare:
        raise SystemExit(f"bare loop setting {key!r}: one of {', '.join(bare)} (or threads, cores)")
    old = bare[key]
    if isinstance(old, bool) or old is None:
        return text.lower() == "true" if text.lower() in ("true", "false") else text
    return type(old)(text)


def plan_fit(args, preset: dict, cuda: bool) -> dict | None:
    """The largest-batch search's bound and memory limit; None with ``--no-fit``."""
    mem_limit = args.mem_limit_gib
    if mem_limit is None and not cuda:
        mem_limit = preset.get("mem_limit_gib")
    if args.no_fit:
        return None
    kind = "torch.cuda.set_per_process_memory_fraction" if cuda else "RLIMIT_AS"
    arms = [a for a in args.fit_arms.split(",") if a] if args.fit_arms else None
    return {"max_groups": args.fit_max_groups or preset["fit_max_groups"], "arms": arms,
            "mem_limit_gib": mem_limit, "mem_limit_kind": mem_limit and kind}  # fmt: skip


def _val(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def result_name(args, preset: str | None) -> str:
    """The results' file name stem: ``--name``, else ``learner_throughput_<preset>``."""
    return args.name or f"learner_throughput_{preset or 'custom'}"


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker_main(args.worker)
        return
    import torch

    t_start = time.monotonic()
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if args.threads is None:  # one thread: on shared cores a descheduled OpenMP thread stalls all
        args.threads = len(os.sched_getaffinity(0)) if cuda else 1
    cfg = plan(args, cuda)
    model_dir = resolve_model_dir(cfg["real_model"])[1] if cfg["real_model"] else None
    batch = cfg["batch"]
    real = real_tokens(batch, batch["groups"], args.seed)
    lengths = [batch["prompt"] + c for g in range(batch["groups"])
               for c in completion_lengths(batch, g, args.seed)]  # fmt: skip
    print(
        f"learner_throughput: {cfg['preset'] or args.config} on {cfg['device']} "
        f"({cfg['dtype']}), {batch['groups']} groups x {batch['n']}: {real:,} real tokens, "
        f"{len(lengths) * max(lengths):,} padded; arms {', '.join(cfg['arms'])}",
        flush=True,
    )
    print(f"pinned: each arm's worker process runs {args.threads} torch thread(s) "
          f"(torch.set_num_threads, OMP_NUM_THREADS, MKL_NUM_THREADS) on cores "
          f"{args.cores or 'unpinned'}" + "".join(
              f"; {k}: {a.get('threads', args.threads)} on {a.get('cores', args.cores) or 'any'}"
              for k, a in cfg["arms"].items() if "threads" in a or "cores" in a), flush=True)  # fmt: skip
    hf_config = model_config(args, model_dir)
    name = cfg["name"]

    def write(counts, runs, arms, peak, partial: str | None = None, per_arm: bool = False):
        payload = report(args, cfg, hf_config, (counts, runs, arms, peak), lengths, real,
                         time.monotonic() - t_start)  # fmt: skip
        if partial:
            payload["partial"] = partial
        write_and_print(name, payload, Path(args.out), quiet=per_arm)  # after an arm: one line

    write(*run_arms(args, cfg, hf_config, real, model_dir, measured=write))


def report(args, cfg: dict, hf_config, results, lengths: list[int], real: int,
           wall_s: float) -> dict:  # fmt: skip
    """The JSON's payload from ``run_arms``' ``results``."""
    counts, runs, arms, peak = results
    cuda = cfg["device"] == "cuda"
    payload = {
        "config": {**cfg, "threads": {"requested": args.threads, "cores": args.cores or "all",
                                      "worker": first_of(runs, "threads")},
                   "model": hf_config.to_diff_dict(), **counts,
                   "peak_tflops": peak[0], "peak_tflops_source": peak[1],
                   "flops_per_token": "6 N (N = parameters, tied weights once; recomputation "
                                      "and attention FLOPs not counted)"},
        "gpu": first_of(runs, "gpu"),
        "versions": library_versions(),
        "batch": batch_facts(lengths, real),
        "arms": arms,
        "targets": targets(arms, cfg, real),
        "wall_s": wall_s,
        "notes": "Each arm's figures come from fresh processes (model load not timed). Peak "
                 "memory: " + ("torch.cuda.max_memory_allocated of the worker process" if cuda
                 else "the worker process's VmHWM (model, optimizer, batch included)") + ".",
    }  # fmt: skip
    payload["table_markdown"] = table(arms)
    payload["rounds_table_markdown"] = rounds_table(arms)
    return payload


if __name__ == "__main__":
    main()
