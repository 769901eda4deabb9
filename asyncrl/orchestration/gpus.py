"""This node's GPUs as the launcher sees them, and its roles' plan (asyncrl/placement.py).

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

from asyncrl.placement import NO_GPUS, Plan, place, request_for

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


def nvidia_smi() -> str:
    """``nvidia-smi -L``'s output; '' when it is missing or fails (no GPU or no driver)."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=_SMI_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""
