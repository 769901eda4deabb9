"""This node's GPUs as the launcher sees them, and its roles' plan (asyncrl/orchestration/placement/plan.py).

Found without initialising CUDA in the launcher (``torch.cuda.device_count()`` would): the
launcher's own ``CUDA_VISIBLE_DEVICES`` when it is set (its roles can use only those, and an
index of ``learner.gpus`` / ``actor.gpus`` is a position in it), else ``nvidia-smi -L``. No
``nvidia-smi`` (or one that fails: no driver) means no GPU: a CPU run.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from asyncrl.orchestration.placement.plan import NO_GPUS, Plan, place, request_for

_SMI_GPU = re.compile(r"^GPU (\d+):", re.MULTILINE)  # "GPU 0: NVIDIA H100 ... (UUID: GPU-...)"
_SMI_TIMEOUT_S = 60.0


def plan_node(
    cfg, roles: Collection[str], detect: Callable[[], tuple[str, ...]] | None = None
) -> Plan:
    """The plan of this node's ``roles`` (``learner``, ``actors``); ValueError naming the fix
    for a layout ``place`` refuses. GPUs are detected (``detect``, default ``node_gpus``) only
    when a role here could use one."""
    request = request_for(cfg, roles)
    if not request.wants_gpus:
        return NO_GPUS
    return place(request_for(cfg, roles, (detect or node_gpus)()))


def node_gpus(
    environ: Mapping[str, str] = os.environ, smi: Callable[[], str] | None = None
) -> tuple[str, ...]:
    """The GPUs this node's roles may use, in index order, as ``CUDA_VISIBLE_DEVICES`` names
    them: the launcher's ``CUDA_VISIBLE_DEVICES`` entries when set, else nvidia-smi's
    indices (``smi``: the text of ``nvidia-smi -L``, default ``nvidia_smi``)."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return visible_entries(visible)
    return tuple(_SMI_GPU.findall((smi or nvidia_smi)()))


def visible_entries(value: str) -> tuple[str, ...]:
    """``"2,3"`` -> ``("2", "3")``; ``""`` -> ``()``. CUDA ignores the entries from the first
    negative one on (``-1`` hides every GPU), so they are dropped here too."""
    out: list[str] = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry or entry.startswith("-"):
            break
        out.append(entry)
    return tuple(out)


def nvidia_smi(*args: str) -> str:
    """``nvidia-smi``'s output (default ``-L``: one line per GPU); '' when it is missing or
    fails (no GPU or no driver)."""
    try:
        done = subprocess.run(
            ["nvidia-smi", *(args or ("-L",))],
            capture_output=True,
            text=True,
            timeout=_SMI_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


_SMI_MEMORY = ("--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits")


def gpu_memory_gib(entry: str, smi: Callable[[], str] | None = None) -> float | None:
    """Memory of the GPU that ``CUDA_VISIBLE_DEVICES`` entry ``entry`` (an index or a UUID)
    names, in GiB; None when nvidia-smi does not say (``smi``: its CSV text)."""
    text = smi() if smi else nvidia_smi(*_SMI_MEMORY)
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and entry in parts[:2]:
            try:
                return float(parts[2]) / 1024
            except ValueError:
                return None
    return None


def check_shared_gpu(cfg, plan: Plan, model_dir: Path, memory=gpu_memory_gib) -> str | None:
    """With ``learner.share_gpu`` and actors placed on a learner GPU: the memory split for the
    model in ``model_dir`` (``asyncrl.orchestration.placement.share.check``: a line to print, or ``ValueError``
    with the numbers); None when no GPU is shared."""
    from asyncrl.orchestration.models.directory import count_params
    from asyncrl.orchestration.placement.share import Share, check

    shared = [g for g in plan.learner if any(g in a for a in plan.actors)]
    if not shared:
        return None
    gpu = shared[0]
    total = memory(gpu)
    if total is None:
        raise ValueError(
            f"learner.share_gpu=true: nvidia-smi does not report GPU {gpu}'s memory, so the "
            "split between the learner and vLLM cannot be checked; check the driver "
            "(nvidia-smi --query-gpu=memory.total)"
        )
    actors = sum(1 for a in plan.actors if gpu in a)
    share = Share(
        total_gib=total,
        learner_fraction=cfg.learner.gpu_memory_fraction,
        actor_fraction=cfg.actor.gpu_memory_utilization,
        actors=actors,
        params=count_params(model_dir),
        dtype=cfg.model.dtype,
        lora=cfg.model.lora.enabled,
    )
    return f"GPU {gpu}: " + check(share)
