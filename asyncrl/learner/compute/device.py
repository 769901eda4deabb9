"""Where the learner computes, and the process group it joins.

CPU: one ``gloo`` group; every tensor lives in host memory.
GPU: rank r uses ``cuda:LOCAL_RANK``; the default group has two backends,
``cpu:gloo,cuda:nccl``: model, gradients and batch tensors travel over NCCL, while host-side
collectives (the stop flag, the batch broadcast from rank 0, DCP's metadata) stay on gloo, so
no code has to copy a control tensor to the GPU just to send it.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from asyncrl.core.config.job import LEARNER_DEVICES
from asyncrl.core.runtime.torchrun import free_port


def resolve_device(setting: str = "auto") -> torch.device:
    """``auto``: this rank's GPU if CUDA is available, else the CPU. ``cuda`` without a GPU
    is an error that says so (a silent CPU fallback would hide a broken install)."""
    if setting not in LEARNER_DEVICES:
        raise ValueError(f"learner.device must be one of {LEARNER_DEVICES}, got {setting!r}")
    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            "learner.device=cuda but torch sees no CUDA GPU (torch "
            f"{torch.__version__}); install a CUDA build of torch or set learner.device=cpu"
        )
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def init_distributed(setting: str = "cpu", memory_fraction: float = 1.0) -> tuple[int, int]:
    """Join the torchrun process group on ``resolve_device(setting)``; returns (rank, world).

    Without torchrun (no ``RANK`` in the environment) a one-process group is made on a free
    loopback port. On a GPU, ``memory_fraction`` < 1 caps what this rank may allocate
    (``learner.gpu_memory_fraction``: a GPU shared with vLLM). Idempotent.
    """
    if not dist.is_initialized():
        device = resolve_device(setting)
        backend = "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
            limit_memory(device, memory_fraction)
            backend = "cpu:gloo,cuda:nccl"
        if "RANK" not in os.environ:  # a single process without torchrun
            os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(free_port()))
        dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def limit_memory(device: torch.device, fraction: float, cuda=torch.cuda) -> bool:
    """Cap this process's allocations on ``device`` at ``fraction`` of its memory (torch's
    caching allocator raises out-of-memory past it); True when a cap was set (``fraction`` <
    1 on a GPU)."""
    if device.type != "cuda" or fraction >= 1:
        return False
    cuda.set_per_process_memory_fraction(fraction, device)
    return True


def current_device() -> torch.device:
    """The device ``init_distributed`` chose (the CPU before it ran or without CUDA)."""
    if dist.is_initialized() and "nccl" in str(dist.get_backend()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
