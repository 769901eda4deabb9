"""Learner throughput on a long-tailed RL batch: asyncrl's learner step, the padded path and a
bare hand-written loop, side by side in one run (issue 15).

    python -m benchmarks.learner_throughput --preset qwen2.5-1.5b   # one GPU
    python -m benchmarks.learner_throughput --preset cpu --cores 1 --rounds 3   # 11 min here
    python -m benchmarks.learner_throughput --config path/to/config.json --groups 8

The model is a random one of a Hugging Face config's shape: a preset (the real Qwen2.5-0.5B,
1.5B and 7B shapes, hard-coded below; ``cpu``: Qwen's 151,936-token vocabulary with a body
small enough to step in seconds on 2 cores; ``tiny``: for the smoke test) or ``--config``. It
is saved as a local safetensors model directory (nothing is downloaded) and every learner arm
builds its policy from it through asyncrl's own ``learner.trainer.build_step_context`` (the
``build_policy`` + AdamW the learner uses, FSDP2 over a one-rank process group as in a run)
and steps with ``learner.step.train_on_batch``, under the default algorithm of
``asyncrl.configload.load_config`` plus the arm's overrides. The batch is ``groups x n`` rows
from a seeded generator: a ``prompt``-token prompt per group, completions
``min(cap, 1 + Exp(mean))``; a batch of k groups is always the first k groups of the stream.

Arms (``--arms``; ``--arm NAME:key=value,...`` adds one: the ``asyncrl`` arm's overrides plus
these, later keys winning):
  padded   the old path: ``learner.micro_batch_rows=0`` (every row padded to the batch's
           longest, one forward/backward), ``model.logprob_chunk_tokens=0`` (full logits),
           no gradient checkpointing;
  asyncrl  ``learner.max_tokens_per_micro_batch=--budget`` (length-sorted token micro-batches;
           ``learner.pack_sequences`` at its default: packed into one stream each on a GPU,
           trimmed rows on the CPU), ``model.logprob_chunk_tokens=--chunk``, gradient
           checkpointing as the preset says (on for the GPU presets);
  bare     ``BareLoop`` below: the ~60-line loop a careful person writes by hand.
GPU arms compute in bfloat16 (``model.dtype=bfloat16``: float32 master weights, FSDP2 mixed
precision; the bare loop: float32 weights under ``torch.autocast``), CPU arms in float32.

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
"""

from __future__ import annotations

import argparse
import hashlib
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

QWEN = {"model_type": "qwen2", "vocab_size": 151_936, "max_position_embeddings": 32_768,
        "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu"}  # fmt: skip
GPU_BATCH = {"groups": 16, "n": 8, "prompt": 256, "mean": 700.0, "cap": 3072}  # issue 15's
PRESETS: dict[str, dict] = {
    "qwen2.5-0.5b": {
        "model": {**QWEN, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                  "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True},
        "batch": GPU_BATCH, "budget": 32_768, "chunk": 1024, "checkpointing": True,
        "fit_max_groups": 256,
    },
    "qwen2.5-1.5b": {
        "model": {**QWEN, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                  "num_attention_heads": 12, "num_key_value_heads": 2, "tie_word_embeddings": True},
        "batch": GPU_BATCH, "budget": 32_768, "chunk": 1024, "checkpointing": True,
        "fit_max_groups": 256,
    },
    "qwen2.5-7b": {  # float32 weights + AdamW: 16 bytes/parameter, 122 GB: more than one H100
        "model": {**QWEN, "vocab_size": 152_064, "hidden_size": 3584, "intermediate_size": 18_944,
                  "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                  "tie_word_embeddings": False},
        "batch": GPU_BATCH, "budget": 16_384, "chunk": 1024, "checkpointing": True,
        "fit_max_groups": 128,
    },
    "cpu": {  # Qwen's vocabulary (the logits matter), a body sized for seconds a step on 2 cores
        "model": {**QWEN, "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True,
                  "max_position_embeddings": 4096},
        "batch": {"groups": 4, "n": 4, "prompt": 16, "mean": 44.0, "cap": 192},
        "budget": 1024, "chunk": 256, "checkpointing": False, "fit_max_groups": 16,
        "mem_limit_gib": 8.0,
    },
    "tiny": {  # the smoke test: seconds
        "model": {**QWEN, "vocab_size": 512, "hidden_size": 32, "intermediate_size": 64,
                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "tie_word_embeddings": True, "max_position_embeddings": 256},
        "batch": {"groups": 2, "n": 4, "prompt": 8, "mean": 12.0, "cap": 48},
        "budget": 128, "chunk": 32, "checkpointing": False, "fit_max_groups": 4,
    },
}  # fmt: skip
DEFAULT_ARMS = "padded,asyncrl,bare"
STATED_PEAKS = [  # (name must contain all of these, dense BF16 TFLOPS, source)
    (("H100", "HBM3"), 989.4, "NVIDIA H100 SXM5 datasheet: 1,979 BF16 TFLOPS with sparsity, "
     "989.4 dense"),
    (("H200",), 989.4, "NVIDIA H200 SXM datasheet: 1,979 BF16 TFLOPS with sparsity, 989.4 dense"),
]  # fmt: skip


# ---------------------------------------------------------------------------- the batch


def _group_seed(seed: int, g: int) -> int:
    return seed * 1_000_003 + g


def completion_lengths(batch: dict, g: int, seed: int) -> list[int]:
    """Group ``g``'s ``n`` completion lengths: ``min(cap, 1 + int(Exp(mean)))``."""
    rng = random.Random(_group_seed(seed, g))
    return [min(batch["cap"], 1 + int(rng.expovariate(1 / batch["mean"])))
            for _ in range(batch["n"])]  # fmt: skip


def real_tokens(batch: dict, groups: int, seed: int) -> int:
    """Prompt + completion tokens of the first ``groups`` groups."""
    return sum(batch["n"] * batch["prompt"] + sum(completion_lengths(batch, g, seed))
               for g in range(groups))  # fmt: skip


def build_batch(batch: dict, groups: int, seed: int, vocab: int):
    """The first ``groups`` groups of the seeded stream, collated (``learner.batch.collate``):
    random token ids, behaviour log-probs in [-4, -0.5], rewards 0/1, all sampled by version 0."""
    import torch

    from asyncrl.types import Group, Sample
    from learner.batch import collate

    out = []
    for g in range(groups):
        gen = torch.Generator().manual_seed(_group_seed(seed, g))
        prompt = torch.randint(1, vocab, (batch["prompt"],), generator=gen).tolist()
        samples = []
        for c in completion_lengths(batch, g, seed):
            ids = torch.randint(1, vocab, (c,), generator=gen).tolist()
            lp = (-0.5 - 3.5 * torch.rand(c, generator=gen, dtype=torch.float64)).tolist()
            reward = float(torch.rand((), generator=gen) < 0.5)
            samples.append(Sample(prompt, ids, lp, [0] * c, reward))
        out.append(Group(f"g{g}", g, 0, samples))
    return collate(out)


# ---------------------------------------------------------------------------- the model


def model_config(args):
    """The HF config: ``--config`` (a config.json or a model directory) or the preset's shape."""
    from transformers import AutoConfig

    if args.config:
        path = Path(args.config)
        raw = json.loads((path / "config.json" if path.is_dir() else path).read_text())
        raw = {k: v for k, v in raw.items() if not k.startswith("_") and k != "architectures"}
        return AutoConfig.for_model(raw.pop("model_type"), **raw)
    shape = dict(PRESETS[args.preset]["model"])
    return AutoConfig.for_model(shape.pop("model_type"), **shape)


def build_model_dir(config, work: Path, seed: int, dtype: str) -> tuple[Path, dict]:
    """A random model of ``config`` saved as ``work/model-<hash>`` (safetensors, ``dtype``);
    reused when it is already there. Returns the directory and the parameter counts."""
    import torch
    from transformers import AutoModelForCausalLM

    key = json.dumps([config.to_dict(), seed, dtype], sort_keys=True, default=str)
    out = work / f"model-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    counts_file = out / "param_counts.json"
    if counts_file.is_file():
        return out, json.loads(counts_file.read_text())
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    params = sum(p.numel() for p in model.parameters())  # a tied head is one parameter
    embed = model.get_input_embeddings().weight.numel()
    head = model.get_output_embeddings().weight
    tied = head is model.get_input_embeddings().weight
    counts = {"n_params": params, "n_params_embedding": embed, "tied_head": tied,
              "n_params_non_embedding": params - embed - (0 if tied else head.numel())}  # fmt: skip
    model.save_pretrained(str(out))
    counts_file.write_text(json.dumps(counts))
    del model
    return out, counts


# ---------------------------------------------------------------------------- the bare loop


def token_groups(lengths: list[int], budget: int) -> list[list[int]]:
    """Rows sorted longest first, packed while rows x the first (longest) row <= budget."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


class BareLoop:
    """The reference: one process, a plain HF model (float32 weights, ``torch.autocast`` to the
    compute dtype), rows sorted by length into token-budgeted micro-batches trimmed to their
    longest row, log-probs of the completion tokens from the final hidden states in chunks
    (each chunk's logits recomputed in backward by ``torch.utils.checkpoint``), HF gradient
    checkpointing, GRPO advantages, the plain clipped-PPO loss against the behaviour
    log-probs (token mean), gradient clipping, AdamW (fused on GPU)."""

    def __init__(self, model_dir, device, dtype, attn, settings: dict):
        import torch
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation=attn
        ).to(device)
        self.model.config.use_cache = False
        if settings["checkpointing"]:
            self.model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        self.model.train()
        self.opt = torch.optim.AdamW(
            self.model.parameters(), lr=settings["lr"], fused=device.type == "cuda"
        )
        self.device, self.dtype, self.s = device, dtype, settings

    def _autocast(self):
        import torch

        return torch.autocast(self.device.type, self.dtype, enabled=self.dtype != torch.float32)

    def _chunk_logprobs(self, h, targets):
        import torch

        with self._autocast():
            logits = self.model.lm_head(h)
        return torch.log_softmax(logits.float(), -1).gather(-1, targets[:, None]).squeeze(-1)

    def step(self, batch) -> dict[str, float]:
        import torch
        from torch.utils.checkpoint import checkpoint

        lengths = batch.attention_mask.sum(-1).tolist()
        plan = token_groups(lengths, self.s["budget"])
        r = batch.rewards
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).flatten()
        n_tokens = batch.loss_mask.sum().clamp(min=1)
        self.opt.zero_grad(set_to_none=True)
        total, padded, chunk, eps = 0.0, 0, self.s["chunk"], self.s["clip_eps"]
        for rows in plan:
            width = lengths[rows[0]]
            padded += len(rows) * width
            idx = torch.tensor(rows, device=self.device)
            ids, att = batch.input_ids[idx, :width], batch.attention_mask[idx, :width]
            mask = batch.loss_mask[idx, : width - 1] > 0
            with self._autocast():
                hidden = self.model.model(input_ids=ids, attention_mask=att).last_hidden_state
            h, targets = hidden[:, :-1][mask], ids[:, 1:][mask]
            lp = torch.cat([
                checkpoint(self._chunk_logprobs, h[s : s + chunk], targets[s : s + chunk],
                           use_reentrant=False)
                for s in range(0, h.shape[0], chunk)
            ])  # fmt: skip
            old = batch.behavior_logprobs[idx, : width - 1][mask]
            a = adv[idx][:, None].expand(-1, width - 1)[mask]
            ratio = torch.exp(lp - old)
            loss = -torch.minimum(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a).sum() / n_tokens
            loss.backward()
            total = total + loss.detach()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.s["grad_clip"])
        self.opt.step()
        real = float(batch.attention_mask.sum())
        return {"loss": float(total), "grad_norm": float(grad_norm), "micro_batches": float(len(plan)),
                "micro_batch_tokens_max": float(max(len(g) * lengths[g[0]] for g in plan)),
                "padding_frac": 1.0 - real / padded}  # fmt: skip


# ---------------------------------------------------------------------------- one worker


def _vm_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/self/status")


def _is_oom(e: BaseException) -> bool:
    import torch

    if isinstance(e, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    text = str(e).lower()
    return any(s in text for s in ("out of memory", "can't allocate memory", "bad_alloc",
                                   "cannot allocate memory", "not enough memory"))  # fmt: skip


def worker(spec: dict) -> dict:
    """One arm in this fresh process: build, one warm-up step, ``repeat`` timed steps."""
    import resource

    import torch

    torch.set_num_threads(spec["threads"])
    if spec["cores"]:
        os.sched_setaffinity(0, spec["cores"])
    cuda = spec["device"] == "cuda"
    limit = spec.get("mem_limit_gib")
    if limit and not cuda:
        resource.setrlimit(resource.RLIMIT_AS, (int(limit * 2**30), int(limit * 2**30)))
    if limit and cuda:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit * 2**30 / total))
    res: dict = {"status": "ok", "times_s": []}
    try:
        step, layout = _build_arm(spec)
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        res["memory_before_step_mib"] = (torch.cuda.memory_allocated() if cuda
                                         else _vm_kib("VmRSS") * 1024) / 2**20  # fmt: skip
        res["layout"] = layout
        t0 = time.perf_counter()
        first = step()
        sync()
        res["warmup_s"] = time.perf_counter() - t0
        keys = ("loss", "grad_norm", "micro_batches", "micro_batch_tokens_max", "padding_frac")
        res["first_step"] = {k: first.get(k) for k in keys}
        for _ in range(spec["repeat"]):
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            res["times_s"].append(time.perf_counter() - t0)
    except Exception as e:  # an OOM is a result (the batch does not fit); anything else raises
        if not _is_oom(e):
            raise
        res = {"status": "oom", "error": f"{type(e).__name__}: {str(e)[:300]}", "times_s": []}
    if cuda:
        res["peak_memory_mib"] = torch.cuda.max_memory_allocated() / 2**20
        res["peak_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
        props = torch.cuda.get_device_properties(0)
        res["gpu"] = {"name": props.name, "count": torch.cuda.device_count(),
                      "memory_gib": round(props.total_memory / 2**30, 1),
                      "capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda,
                      "cudnn": torch.backends.cudnn.version()}  # fmt: skip
    else:
        res["peak_memory_mib"] = _vm_kib("VmHWM") / 1024
    res["threads"] = {"torch_threads": torch.get_num_threads(),
                      "cores": sorted(os.sched_getaffinity(0))}  # fmt: skip
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return res


def _build_arm(spec: dict):
    """``(step, "attention implementation, layout")`` of the arm ``spec`` describes."""
    import torch

    batch = build_batch(spec["batch"], spec["groups"], spec["seed"], spec["vocab"])
    torch.manual_seed(spec["seed"])
    if spec["kind"] == "bare":
        from learner.model import attention_impl

        device = torch.device("cuda" if spec["device"] == "cuda" else "cpu")
        dtype = torch.bfloat16 if spec["device"] == "cuda" else torch.float32
        attn = attention_impl("auto", str(dtype).split(".")[-1], device)
        loop = BareLoop(spec["model_dir"], device, dtype, attn, spec["bare"])
        batch = batch.to(device)
        return (lambda: loop.step(batch)), f"{loop.model.config._attn_implementation}, bucketed"
    from asyncrl.configload import load_config
    from learner.device import current_device, init_distributed
    from learner.step import train_on_batch
    from learner.trainer import build_step_context

    cfg = load_config(spec["overrides"])
    rank, world = init_distributed(cfg.learner.device)
    ctx = build_step_context(cfg, spec["model_dir"], rank, world)
    batch = batch.to(current_device())
    attn = getattr(getattr(ctx.model, "config", None), "_attn_implementation", None)
    if getattr(ctx, "pack_sequences", False):
        layout = "packed"
    else:
        layout = "bucketed" if ctx.max_tokens_per_micro_batch else "padded"
    return (lambda: train_on_batch(ctx, batch)), f"{attn}, {layout}"


def run_worker(spec: dict, env: dict, timeout: float) -> dict:
    """``worker(spec)`` in a fresh process; a crash (killed for memory, a failure under the
    memory limit) comes back as ``status: failed`` with the end of its output."""
    cmd = [sys.executable, "-m", "benchmarks.learner_throughput", "--worker", json.dumps(spec)]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"status": "failed", "error": f"timed out after {timeout:.0f} s", "times_s": []}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return {**json.loads(line[7:]), "process_s": time.monotonic() - t0}
    tail = (proc.stdout + proc.stderr)[-1500:]
    return {"status": "failed", "error": f"exit {proc.returncode}: {tail}", "times_s": []}


# ---------------------------------------------------------------------------- the run


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help="default: qwen2.5-1.5b with a GPU, cpu without",
    )
    p.add_argument("--config", help="an HF config.json (or model dir) for the shape instead")
    for name, kind in (("groups", int), ("n", int), ("prompt", int), ("mean", float), ("cap", int)):
        p.add_argument(f"--{name}", type=kind, help="batch: override the preset's")
    p.add_argument("--budget", type=int, help="tokens per micro-batch (asyncrl, bare)")
    p.add_argument("--chunk", type=int, help="log-prob chunk positions (asyncrl, bare)")
    p.add_argument("--checkpointing", choices=["true", "false"], help="asyncrl and bare arms")
    p.add_argument("--arms", default=DEFAULT_ARMS)
    p.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="NAME:key=value,...",
        help="add an arm: the asyncrl arm's overrides plus these",
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
    p.add_argument("--no-fit", action="store_true", help="skip the largest-batch search")
    p.add_argument("--fit-max-groups", type=int, help="upper bound of the search")
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
    base = {"learner.device": device, "model.dtype": dtype, "actor.max_tokens": batch["cap"]}
    base |= dict(kv.split("=", 1) for kv in args.set)
    learner_arms = {
        "padded": {"learner.micro_batch_rows": 0, "learner.max_tokens_per_micro_batch": 0,
                   "model.logprob_chunk_tokens": 0, "model.gradient_checkpointing": False},
        "asyncrl": {"learner.micro_batch_rows": 0, "learner.max_tokens_per_micro_batch": budget,
                    "model.logprob_chunk_tokens": chunk, "model.gradient_checkpointing": ckpt},
    }  # fmt: skip
    for text in args.arm:
        name, _, kvs = text.partition(":")
        extra = dict(kv.split("=", 1) for kv in kvs.split(",") if kv)
        learner_arms[name] = {**learner_arms["asyncrl"], **extra}
    names = [a for a in args.arms.split(",") if a] + [t.partition(":")[0] for t in args.arm]
    arms = {}
    for name in dict.fromkeys(names):
        if name == "bare":
            arms[name] = {"kind": "bare", "settings": {
                "budget": budget, "chunk": chunk, "checkpointing": ckpt, "lr": 2e-4,
                "grad_clip": 1.0, "clip_eps": 0.2, "dtype": dtype}}  # fmt: skip
        elif name in learner_arms:
            ov = {**base, **learner_arms[name]}
            arms[name] = {"kind": "learner", "overrides": [f"{k}={_val(v)}" for k, v in ov.items()]}
        else:
            raise SystemExit(f"unknown arm {name!r}: padded, asyncrl, bare or one given by --arm")
    mem_limit = args.mem_limit_gib
    if mem_limit is None and not cuda:
        mem_limit = preset.get("mem_limit_gib")
    fit = None
    if not args.no_fit:
        kind = "torch.cuda.set_per_process_memory_fraction" if cuda else "RLIMIT_AS"
        fit = {"max_groups": args.fit_max_groups or preset["fit_max_groups"],
               "mem_limit_gib": mem_limit, "mem_limit_kind": mem_limit and kind}  # fmt: skip
    return {
        "preset": None if args.config else preset_name,
        "batch_preset": preset_name,
        "config_file": args.config,
        "device": device,
        "dtype": dtype,
        "batch": batch,
        "budget_tokens": budget,
        "chunk_tokens": chunk,
        "gradient_checkpointing": ckpt,
        "arms": arms,
        "rounds": args.rounds,
        "repeat": args.repeat,
        "seed": args.seed,
        "fit": fit,
        "algorithm": "default (asyncrl.configload.load_config: grpo, decoupled_ppo, token_mean)",
    }


def _val(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def stated_peak(gpu: dict | None, flag: float | None) -> tuple[float | None, str]:
    """(peak TFLOPS, where it comes from); None when nothing honest can be said."""
    if flag:
        return flag, "--peak-tflops"
    if gpu is None:
        return None, "CPU: no stated peak FLOPS; pass --peak-tflops to compute MFU"
    for needles, tflops, source in STATED_PEAKS:
        if all(n in gpu["name"].upper() for n in needles):
            return tflops, source
    return None, (f"no stated dense BF16 peak for {gpu['name']!r} here (only H100 SXM and H200 "
                  "SXM); pass --peak-tflops")  # fmt: skip


class Runner:
    def __init__(self, args, cfg: dict, model_dir: Path, vocab: int):
        self.args, self.cfg, self.model_dir, self.vocab = args, cfg, model_dir, vocab
        self.t0 = time.monotonic()
        threads = str(args.threads)
        self.env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
                    "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}  # fmt: skip

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.0f} s] {text}", flush=True)

    def spec(self, arm: str, groups: int, repeat: int, mem_limit=None) -> dict:
        a = self.cfg["arms"][arm]
        from asyncrl.config_checks import parse_cores

        return {"kind": a["kind"], "overrides": a.get("overrides"), "bare": a.get("settings"),
                "model_dir": str(self.model_dir), "batch": self.cfg["batch"], "groups": groups,
                "seed": self.cfg["seed"], "vocab": self.vocab, "device": self.cfg["device"],
                "threads": self.args.threads, "cores": parse_cores(self.args.cores),
                "repeat": repeat, "mem_limit_gib": mem_limit}  # fmt: skip

    def measure(self) -> dict[str, list[dict]]:
        """``rounds`` interleaved rounds: every arm's worker in turn, at the preset batch."""
        groups = self.cfg["batch"]["groups"]
        runs: dict[str, list[dict]] = {arm: [] for arm in self.cfg["arms"]}
        for r in range(self.cfg["rounds"]):
            for arm in runs:
                if runs[arm] and runs[arm][0]["status"] != "ok":
                    continue  # it did not fit (or failed): once is enough
                res = run_worker(self.spec(arm, groups, self.cfg["repeat"]), self.env,
                                 self.args.timeout)  # fmt: skip
                runs[arm].append(res)
                if res["status"] == "ok":
                    steps = ", ".join(f"{t:.2f}" for t in res["times_s"])
                    self.say(f"round {r + 1}/{self.cfg['rounds']} {arm} ({res['layout']}): "
                             f"steps {steps} s "
                             f"(warm-up {res['warmup_s']:.2f} s), peak "
                             f"{res['peak_memory_mib']:.0f} MiB")  # fmt: skip
                else:
                    self.say(f"round {r + 1} {arm}: {res['status']}: {res['error'][-300:]}")
        return runs

    def fit(self, arm: str, first: dict) -> dict:
        """Largest number of groups whose step completes: doubling from the measured batch (or
        halving when it did not fit), then bisecting; every try one step in a fresh process."""
        fit = self.cfg["fit"]
        base, top = self.cfg["batch"]["groups"], max(1, fit["max_groups"])
        tries: list[dict] = []

        def fits(g: int) -> bool:
            res = run_worker(self.spec(arm, g, 0, fit["mem_limit_gib"]), self.env,
                             self.args.timeout)  # fmt: skip
            tries.append({"groups": g, "real_tokens": real_tokens(self.cfg["batch"], g,
                          self.cfg["seed"]), "status": res["status"],
                          "peak_memory_mib": res.get("peak_memory_mib"),
                          "error": res.get("error")})  # fmt: skip
            self.say(f"fit {arm}: {g} groups -> {res['status']}")
            return res["status"] == "ok"

        start = min(base, top)
        if fit["mem_limit_gib"] is None and start == base and first["status"] in ("ok", "oom"):
            ok = first["status"] == "ok"  # the timing run was this try
            tries.append({"groups": base, "real_tokens": real_tokens(self.cfg["batch"], base,
                          self.cfg["seed"]), "status": first["status"], "from": "timing run",
                          "peak_memory_mib": first.get("peak_memory_mib")})  # fmt: skip
        else:
            ok = fits(start)
        lo, hi = (start, None) if ok else (0, start)
        while ok and hi is None and lo < top:
            g = min(2 * lo, top)
            if fits(g):
                lo = g
            else:
                hi = g
        while not ok and hi > 1:
            g = hi // 2
            if fits(g):
                lo, ok = g, True
            else:
                hi = g
        while hi is not None and hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        failures = [t for t in tries if t["status"] == "failed"]
        return {
            "largest_groups": lo,
            "largest_rows": lo * self.cfg["batch"]["n"],
            "largest_real_tokens": real_tokens(self.cfg["batch"], lo, self.cfg["seed"]),
            "first_failing_groups": hi,
            "at_bound": hi is None,
            "max_groups": top,
            "mem_limit_gib": fit["mem_limit_gib"],
            "tries": tries,
            "note": ("bounded by --fit-max-groups: the arm may fit more" if hi is None else
                     "a try counts as not fitting when it runs out of memory (oom) or its process "
                     "dies (failed: see its error)") + ("" if not failures else
                     f"; {len(failures)} tr{'y' if len(failures) == 1 else 'ies'} failed"),
        }  # fmt: skip


def summarise(cfg: dict, runs: dict[str, list[dict]], counts: dict, real: int, peak) -> dict:
    """Per-arm figures, ratios against ``padded`` and ``bare``."""
    peak_tflops, peak_source = peak
    out = {}
    for arm, rs in runs.items():
        ok = [r for r in rs if r["status"] == "ok"]
        a = {**cfg["arms"][arm], "status": rs[0]["status"], "rounds": len(rs)}
        if ok:
            times = [t for r in ok for t in r["times_s"]]
            step = statistics.median(times)
            a |= {"step_s_median": step, "step_s_min": min(times), "step_s_all": times,
                  "warmup_s": [r["warmup_s"] for r in ok],
                  "real_tokens_per_s": real / step, "first_step": ok[0]["first_step"],
                  "layout": ok[0].get("layout")}  # fmt: skip
        else:
            a |= {"real_tokens_per_s": None, "error": rs[0].get("error")}
        tok_s = a["real_tokens_per_s"]
        if tok_s is not None and peak_tflops:
            a["mfu"] = 6 * counts["n_params"] * tok_s / (peak_tflops * 1e12)
        else:
            a["mfu"] = None
            a["mfu_null_reason"] = peak_source if tok_s is not None else "the step did not run"
        peaks = [r["peak_memory_mib"] for r in rs if r.get("peak_memory_mib") is not None]
        a["peak_memory_mib"] = max(peaks) if peaks else None
        a["memory_before_step_mib"] = ok[0].get("memory_before_step_mib") if ok else None
        out[arm] = a
    for ref in ("padded", "bare"):
        base = out.get(ref)
        for a in out.values():
            both = base and base["real_tokens_per_s"] and a["real_tokens_per_s"]
            a[f"tokens_per_s_vs_{ref}"] = (a["real_tokens_per_s"] / base["real_tokens_per_s"]
                                           if both else None)  # fmt: skip
            both = base and base["peak_memory_mib"] and a["peak_memory_mib"]
            a[f"peak_memory_vs_{ref}"] = (a["peak_memory_mib"] / base["peak_memory_mib"]
                                          if both else None)  # fmt: skip
    return out


def targets(arms: dict, cfg: dict, real: int) -> list[dict]:
    """Issue 15's targets, where this run's arms can say: asyncrl >= 2x padded tokens/s at
    <= 1/3 of its peak memory (the CPU criterion), asyncrl >= 1.5x the bare loop (the GPU one)."""
    out = []
    a = arms.get("asyncrl", {})
    checks = [
        ("tokens_per_s_vs_padded", 2.0, ">=", "asyncrl >= 2x padded real tokens/s"),
        ("peak_memory_vs_padded", 1 / 3, "<=", "asyncrl peak memory <= 1/3 of padded"),
        ("tokens_per_s_vs_bare", 1.5, ">=", "asyncrl >= 1.5x the bare loop's tokens/s"),
    ]
    for key, bound, op, text in checks:
        v = a.get(key)
        if v is not None:
            out.append({"target": text, "value": v,
                        "met": v >= bound if op == ">=" else v <= bound})  # fmt: skip
    if cfg["device"] == "cuda":
        out.append({"target": "batch >= 100k real tokens", "value": real, "met": real >= 100_000})
    return out


def table(arms: dict) -> str:
    header = ["arm", "real tok/s", "x padded", "x bare", "MFU", "peak MiB", "x padded mem",
              "step s", "micro-batches", "padding", "largest fit (groups)"]  # fmt: skip
    rows = []
    for name, a in arms.items():
        fs = a.get("first_step") or {}
        fit = a.get("fit")
        if fit:
            fit_cell = f"{'>=' if fit['at_bound'] else ''}{fit['largest_groups']}"
        else:
            fit_cell = "skipped"
        mfu = a["mfu"]
        rows.append([name, a["real_tokens_per_s"] or a["status"], a["tokens_per_s_vs_padded"],
                     a["tokens_per_s_vs_bare"], f"{100 * mfu:.1f}%" if mfu is not None else None,
                     a["peak_memory_mib"], a["peak_memory_vs_padded"], a.get("step_s_median"),
                     fs.get("micro_batches"), fs.get("padding_frac"), fit_cell])  # fmt: skip
    return md_table(header, rows)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        res = worker(json.loads(args.worker))
        print("RESULT " + json.dumps(res), flush=True)
        return
    import torch

    t_start = time.monotonic()
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if args.threads is None:  # one thread: on shared cores a descheduled OpenMP thread stalls all
        args.threads = len(os.sched_getaffinity(0)) if cuda else 1
    cfg = plan(args, cuda)
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
    hf_config = model_config(args)
    with tempfile.TemporaryDirectory(prefix="asyncrl-throughput-") as tmp:
        work = Path(args.work_dir) if args.work_dir else Path(tmp)
        t0 = time.monotonic()
        model_dir, counts = build_model_dir(hf_config, work, args.seed,
                                            "bfloat16" if cuda else "float32")  # fmt: skip
        print(
            f"random model: {counts['n_params']:,} parameters ({time.monotonic() - t0:.0f} s)",
            flush=True,
        )
        runner = Runner(args, cfg, model_dir, hf_config.vocab_size)
        runs = runner.measure()
        first_gpu = next((r["gpu"] for rs in runs.values() for r in rs if "gpu" in r), None)
        peak = stated_peak(first_gpu, args.peak_tflops)
        arms = summarise(cfg, runs, counts, real, peak)
        for arm, a in arms.items():
            if cfg["fit"] is None:
                a["fit"], a["fit_skipped_reason"] = None, "--no-fit"
            else:
                a["fit"] = runner.fit(arm, runs[arm][0])
    threads = next((r["threads"] for rs in runs.values() for r in rs if "threads" in r), None)
    versions = {}
    for mod in ("transformers", "flash_attn", "hydra"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # not installed: say so
            versions[mod] = None
    payload = {
        "config": {**cfg, "threads": {"requested": args.threads, "cores": args.cores or "all",
                                      "worker": threads},
                   "model": hf_config.to_diff_dict(), **counts,
                   "peak_tflops": peak[0], "peak_tflops_source": peak[1],
                   "flops_per_token": "6 N (N = parameters, tied weights once; recomputation "
                                      "and attention FLOPs not counted)"},
        "gpu": first_gpu,
        "versions": {"torch": torch.__version__, **versions},
        "batch": {"rows": len(lengths), "real_tokens": real, "width": max(lengths),
                  "padded_tokens": len(lengths) * max(lengths),
                  "row_len_mean": real / len(lengths), "row_len_max": max(lengths)},
        "arms": arms,
        "targets": targets(arms, cfg, real),
        "wall_s": time.monotonic() - t_start,
        "notes": "Each arm's figures come from fresh processes (model load not timed). Peak "
                 "memory: " + ("torch.cuda.max_memory_allocated of the worker process" if cuda
                 else "the worker process's VmHWM (model, optimizer, batch included)") + ".",
    }  # fmt: skip
    payload["table_markdown"] = table(arms)
    name = args.name or f"learner_throughput_{cfg['preset'] or 'custom'}"
    path = write_result(name, payload, Path(args.out))
    print(payload["table_markdown"])
    for t in payload["targets"]:
        print(f"{'MET' if t['met'] else 'NOT MET'}: {t['target']} ({t['value']:.3g})")
    print(
        f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path} "
        f"({payload['wall_s']:.0f} s)"
    )


if __name__ == "__main__":
    main()
