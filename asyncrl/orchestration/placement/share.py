"""One GPU for the learner and a vLLM actor (``layout=gpu1``, ``learner.share_gpu``): the
memory split, checked with numbers before anything starts. Pure: no CUDA, no I/O.

Both processes run at once, each inside its own share of the GPU's memory:

    learner  ``learner.gpu_memory_fraction`` of the memory (torch's
             ``set_per_process_memory_fraction``: an allocation past it is an out-of-memory
             error in the learner, not a crash of vLLM)
    actor    ``actor.gpu_memory_utilization`` (vLLM sizes its KV cache to fill it)
    both     a CUDA context each (``CONTEXT_GIB``), outside both shares

Weights travel through host memory (``shm``): NCCL cannot join two ranks on one GPU.
Concurrent rather than interleaved (vLLM's sleep mode): generation keeps running while the
learner trains, which is the point of asyncrl; the price is that each side has only its share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CONTEXT_GIB = 0.6
"""Memory a process's CUDA context and allocator take outside its share (about 0.3-0.6 GiB
on recent drivers; the larger figure, so the check errs on the side of refusing)."""
TRAIN_BYTES = {"float32": 16.0, "bfloat16": 18.0, "float16": 18.0}
"""Learner bytes per parameter before activations: float32 weights, gradients and AdamW's
two moments (4 x 4 B), plus a 2-byte compute copy of the weights when training in half
precision (learner/compute/model.py keeps float32 masters)."""
FROZEN_BYTES = {"float32": 4.0, "bfloat16": 6.0, "float16": 6.0}
"""Learner bytes per parameter with LoRA (``model.lora``): the frozen float32 base weights
(and their 2-byte compute copy in half precision), no gradient and no AdamW state; the
adapters' own (16 B each of a few million parameters) are left out."""
SERVE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}
"""vLLM's bytes per parameter: the weights in ``model.dtype``."""
KV_MIN_FRACTION = 0.1
"""The least of vLLM's share left for its KV cache after the weights (else it would start
and generate only a few sequences at a time)."""
GIB = 1024**3


@dataclass(frozen=True)
class Share:
    """What shares one GPU: its memory, the two fractions, the model."""

    total_gib: float
    """The GPU's memory (``nvidia-smi --query-gpu=memory.total``)."""
    learner_fraction: float
    """``learner.gpu_memory_fraction``."""
    actor_fraction: float
    """``actor.gpu_memory_utilization``, per actor on this GPU."""
    actors: int
    """vLLM actors on this GPU (>= 1)."""
    params: int
    """The model's parameters (0: unknown, only the fractions are checked)."""
    dtype: str
    """``model.dtype``."""
    lora: bool = False
    """``model.lora.rank > 0``: the learner holds the base frozen (``FROZEN_BYTES``)."""

    @property
    def learner_bytes(self) -> float:
        """The learner's bytes a parameter before activations."""
        return (FROZEN_BYTES if self.lora else TRAIN_BYTES)[self.dtype]


def check(share: Share) -> str:
    """One line describing the split; ``ValueError`` with the numbers and a fix when the two
    sides cannot fit."""
    s = share
    need_learner = s.params * s.learner_bytes / GIB
    weights = s.params * SERVE_BYTES[s.dtype] / GIB
    learner_gib = s.learner_fraction * s.total_gib
    actor_gib = s.actor_fraction * s.total_gib
    contexts = (1 + s.actors) * CONTEXT_GIB
    used = s.learner_fraction + s.actors * s.actor_fraction + contexts / s.total_gib
    where = (
        f"one GPU of {s.total_gib:.1f} GiB shared by the learner and {s.actors} vLLM actor(s), "
        f"model {s.params / 1e9:.2f}B parameters in {s.dtype}" + (" with LoRA" if s.lora else "")
    )
    if used > 1:
        free = max(
            0.0, math.floor((1 - s.actors * s.actor_fraction - contexts / s.total_gib) * 100) / 100
        )
        raise ValueError(
            f"{where}: learner.gpu_memory_fraction={s.learner_fraction} + {s.actors} x "
            f"actor.gpu_memory_utilization={s.actor_fraction} + {contexts:.1f} GiB of CUDA "
            f"contexts is {used:.2f} of the GPU; lower them so they sum to at most 1 (e.g. "
            f"learner.gpu_memory_fraction={free:.2f})"
        )
    if not s.params:
        return (
            f"one GPU of {s.total_gib:.1f} GiB shared by the learner ({learner_gib:.1f} GiB) and "
            f"{s.actors} vLLM actor(s) ({actor_gib:.1f} GiB each); the model's size was not "
            "read (no *.safetensors), so only the fractions were checked"
        )
    if need_learner > learner_gib:
        raise ValueError(
            f"{where}: the learner needs at least {need_learner:.1f} GiB ({_needs(s)}, "
            f"{s.learner_bytes:.0f} B a parameter, before activations), "
            f"but learner.gpu_memory_fraction={s.learner_fraction} gives it "
            f"{learner_gib:.1f} GiB: raise it (and lower actor.gpu_memory_utilization), use "
            "learner.cpu_offload=true, or a GPU per role (layout=node2)"
        )
    if weights > (1 - KV_MIN_FRACTION) * actor_gib:
        raise ValueError(
            f"{where}: vLLM needs {weights:.1f} GiB for the weights plus room for its KV "
            f"cache, but actor.gpu_memory_utilization={s.actor_fraction} gives it "
            f"{actor_gib:.1f} GiB: raise it (and lower learner.gpu_memory_fraction), or use "
            "a GPU per role (layout=node2)"
        )
    return (
        f"{where}: learner {learner_gib:.1f} GiB (needs {need_learner:.1f} before "
        f"activations), vLLM {actor_gib:.1f} GiB each ({weights:.1f} of weights, the rest KV "
        f"cache), {contexts:.1f} GiB of CUDA contexts"
    )


def _needs(s: Share) -> str:
    return "frozen weights, LoRA adapters" if s.lora else "weights, gradients and AdamW state"
