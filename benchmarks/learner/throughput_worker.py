"""The learner-throughput benchmark's worker (``benchmarks.learner.throughput``): one arm in a
fresh process, built, warmed up and timed, its peak memory measured (an out-of-memory error is
a result, not a crash); the arms are asyncrl's learner step under the arm's overrides and
``BareLoop``, the hand-written reference loop. ``run_worker`` is the parent's side: it starts
``python -m benchmarks.learner.throughput --worker SPEC`` and reads back the ``RESULT`` line
that ``worker_main`` prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import REPO
from benchmarks.learner.throughput_model import build_batch

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
    import torch

    cuda = spec["device"] == "cuda"
    _pin_and_limit(spec, cuda)
    res = _time_steps(spec, cuda)
    res |= _peak_memory(cuda)
    res["threads"] = {"torch_threads": torch.get_num_threads(),
                      "cores": sorted(os.sched_getaffinity(0))}  # fmt: skip
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return res


def _pin_and_limit(spec: dict, cuda: bool) -> None:
    """Threads and cores as ``spec`` says; its memory limit: ``RLIMIT_AS`` on CPU, a CUDA
    memory fraction on GPU."""
    import resource

    import torch

    torch.set_num_threads(spec["threads"])
    if spec["cores"]:
        os.sched_setaffinity(0, spec["cores"])
    limit = spec.get("mem_limit_gib")
    if limit and not cuda:
        resource.setrlimit(resource.RLIMIT_AS, (int(limit * 2**30), int(limit * 2**30)))
    if limit and cuda:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit * 2**30 / total))


def _time_steps(spec: dict, cuda: bool) -> dict:
    """Build the arm, time a warm-up step and ``repeat`` steps; ``status: oom`` when it runs out
    of memory."""
    import torch

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
        if spec.get("profile"):
            res["profile"] = profile_step(step, sync, cuda, spec["profile"])
    except Exception as e:  # an OOM is a result (the batch does not fit); anything else raises
        if not _is_oom(e):
            raise
        res = {"status": "oom", "error": f"{type(e).__name__}: {str(e)[:300]}", "times_s": []}
    return res


def profile_step(step, sync, cuda: bool, path: str, rows: int = 40) -> dict:
    """One more step under ``torch.profiler`` (not among the timed ones): the operators'
    self time, by device time on a GPU and CPU time on both, written as text tables to
    ``path``; returns the path, the profiled step's wall time and, on a GPU, the summed
    kernel time (``device_busy_s``: far below the wall time = the GPU waits on the host)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync()
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        step()
        sync()
    wall = time.perf_counter() - t0
    table = prof.key_averages()
    busy = sum(e.self_device_time_total for e in table  # kernels, not the ops that ran them
               if e.device_type != DeviceType.CPU and not e.is_user_annotation) / 1e6  # fmt: skip
    keys = (["self_device_time_total"] if cuda else []) + ["self_cpu_time_total"]
    text = [f"one profiled step: {wall:.3f} s wall (profiler overhead included), "
            f"kernels {busy:.3f} s\n"]  # fmt: skip
    text += [f"## by {k}\n{table.table(sort_by=k, row_limit=rows, max_name_column_width=70)}\n"
             for k in keys]  # fmt: skip
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(text))
    return {"path": path, "wall_s": wall, "device_busy_s": busy}


def _peak_memory(cuda: bool) -> dict:
    """This process's peak memory: ``torch.cuda.max_memory_allocated`` (and the GPU) on GPU,
    ``VmHWM`` on CPU."""
    import torch

    if not cuda:
        return {"peak_memory_mib": _vm_kib("VmHWM") / 1024}
    props = torch.cuda.get_device_properties(0)
    return {"peak_memory_mib": torch.cuda.max_memory_allocated() / 2**20,
            "peak_reserved_mib": torch.cuda.max_memory_reserved() / 2**20,
            "gpu": {"name": props.name, "count": torch.cuda.device_count(),
                    "memory_gib": round(props.total_memory / 2**30, 1),
                    "capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda,
                    "cudnn": torch.backends.cudnn.version()}}  # fmt: skip


def _build_arm(spec: dict):
    """``(step, "attention implementation, layout")`` of the arm ``spec`` describes."""
    import torch

    batch = build_batch(spec["batch"], spec["groups"], spec["seed"], spec["vocab"])
    torch.manual_seed(spec["seed"])
    if spec["kind"] == "bare":
        from asyncrl.learner.compute.model import attention_impl

        device = torch.device("cuda" if spec["device"] == "cuda" else "cpu")
        dtype = getattr(torch, spec["bare"]["dtype"])  # the compute dtype, under autocast
        attn = attention_impl("auto", spec["bare"]["dtype"], device)
        loop = BareLoop(spec["model_dir"], device, dtype, attn, spec["bare"])
        batch = batch.to(device)
        return (lambda: loop.step(batch)), f"{loop.model.config._attn_implementation}, bucketed"
    from asyncrl.core.config.load import load_config
    from asyncrl.learner.compute.device import current_device, init_distributed
    from asyncrl.learner.compute.step import train_on_batch
    from asyncrl.learner.trainer import build_step_context

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


# ------------------------------------------------------------------ the process boundary


def worker_main(spec_json: str) -> None:
    """``--worker SPEC``: run ``worker`` and print its result as one ``RESULT {json}`` line."""
    res = worker(json.loads(spec_json))
    print("RESULT " + json.dumps(res), flush=True)


def run_worker(spec: dict, env: dict, timeout: float) -> dict:
    """``worker(spec)`` in a fresh process; a crash (killed for memory, a failure under the
    memory limit) comes back as ``status: failed`` with the end of its output."""
    cmd = [sys.executable, "-m", "benchmarks.learner.throughput", "--worker", json.dumps(spec)]
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
