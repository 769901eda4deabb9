"""Sharded loading: no rank ever holds the full model, only its own shards.

Under a process group, ``asyncrl.learner.compute.model.load_sharded_hf_model`` (the policy, the reference) and
``asyncrl.learner.compute.critic`` (the critic's body) build a model this way::

    config.json ── construct() under parameters_on_meta() ──> parameters on the meta device,
                                                             buffers computed for real
      ── shard (FSDP2 fully_shard) ──> DTensor parameters, still on meta
      ── materialize(model, device) ──> each rank allocates only its local shards (to_empty);
                                        the buffers are put back
      ── load_local_shards(model, checkpoint) ──> one tensor at a time: the rank's block of it,
                                                  read from the mmapped safetensors file and
                                                  converted to the parameter's dtype

Nothing is communicated: every rank reads its own block. The largest tensor a rank allocates
is one uninitialised parameter at construction (``torch.empty`` on the CPU, never written,
moved to meta at once, as accelerate's ``init_empty_weights(include_buffers=False)`` does);
everything it writes is at most one local shard (tests/unit/learner/test_sharded_load.py).

What it loads: safetensors checkpoints (``model.safetensors`` or a sharded
``model.safetensors.index.json``) whose tensor names are the model's state-dict names, tied
weights read once. Two kinds raise ``NotStreamable`` before a model is built, and the caller
falls back to loading the full model on every rank (rank 0 prints why): a directory without
safetensors (``pytorch_model.bin``), and model types whose checkpoints transformers renames or
fuses on load (e.g. per-expert MoE weights into fused ones). A tensor the model lacks, one
the checkpoint lacks, or a shape that differs is an error naming the tensor and the file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"


class NotStreamable(Exception):
    """The checkpoint cannot be loaded shard by shard; the message says why."""


class SafetensorsCheckpoint:
    """The tensors of an HF directory's safetensors file(s), each read by block (mmap).

    ``files``: tensor name -> the file holding it. Use as a context manager (closes the files).
    """

    def __init__(self, model_dir: Path, files: dict[str, Path]) -> None:
        self.model_dir, self.files = model_dir, files
        self._open: dict[Path, object] = {}
        self._stack = ExitStack()

    @classmethod
    def find(cls, model_dir: str | Path) -> SafetensorsCheckpoint:
        """The checkpoint of ``model_dir``: its index's weight map, or ``model.safetensors``'s
        names; ``NotStreamable`` when it has neither."""
        from safetensors import safe_open

        path = Path(model_dir)
        if (path / _INDEX).is_file():
            weight_map = json.loads((path / _INDEX).read_text())["weight_map"]
            return cls(path, {k: path / f for k, f in weight_map.items()})
        if (path / _SINGLE).is_file():
            with safe_open(str(path / _SINGLE), framework="pt") as f:
                return cls(path, dict.fromkeys(f.keys(), path / _SINGLE))
        found = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        raise NotStreamable(
            f"{path} has no {_SINGLE} or {_INDEX} (it has {found or 'no weight files'}); "
            "sharded loading reads safetensors only. To convert once: "
            "AutoModelForCausalLM.from_pretrained(dir).save_pretrained(new_dir)"
        )

    def __enter__(self) -> SafetensorsCheckpoint:
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()
        self._open.clear()

    def _handle(self, key: str):
        from safetensors import safe_open

        file = self.files[key]
        if file not in self._open:
            self._open[file] = self._stack.enter_context(safe_open(str(file), framework="pt"))
        return self._open[file]

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._handle(key).get_slice(key).get_shape())

    def read(self, key: str, index: tuple[slice, ...]) -> torch.Tensor:
        """The block ``tensor[index]`` in the file's dtype, a view of the mmapped file: only
        the pages it covers are read (the copy into the shard reads them)."""
        if not index:  # a 0-d tensor
            return self._handle(key).get_tensor(key)
        return self._handle(key).get_slice(key)[index]


def open_streamable(model_dir: Path, model_type: str) -> SafetensorsCheckpoint | None:
    """``model_dir``'s checkpoint, to load shard by shard; None when it cannot be (rank 0 says
    why): the caller then loads the full model on every rank, as without sharded loading."""
    try:
        check_streamable(model_type)
        return SafetensorsCheckpoint.find(model_dir)
    except NotStreamable as e:
        if not dist.is_initialized() or dist.get_rank() == 0:
            print(f"[learner] {e}: every rank loads the full model", flush=True)
        return None


def check_streamable(model_type: str) -> None:
    """``NotStreamable`` when transformers converts this model type's checkpoint names on
    load (``transformers.conversion_mapping``: e.g. Qwen2-MoE's per-expert weights fused into
    one tensor), which ``load_local_shards`` does not reproduce."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:  # a transformers without load-time conversions
        return
    if get_checkpoint_conversion_mapping(model_type) is not None:
        raise NotStreamable(
            f"transformers converts {model_type} checkpoints' tensor names when loading "
            "(transformers.conversion_mapping), which sharded loading does not do"
        )


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside put every parameter on the meta device and keep their buffers
    where they are computed. The buffers (e.g. the rotary embedding's ``inv_freq``, which is
    in no checkpoint) are thus real, while an all-meta build would leave them garbage.

    Each parameter is first allocated by its module's constructor (uninitialised, on the
    default device) and moved to meta as it is registered, before it is initialised."""
    register = nn.Module.register_parameter

    def register_on_meta(module, name, param):
        register(module, name, param)
        if param is not None and not param.is_meta:  # a tied (already meta) one stays itself
            p = module._parameters[name]
            module._parameters[name] = type(p)(p.to("meta"), requires_grad=p.requires_grad)

    nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def materialize(model: nn.Module, device: torch.device) -> None:
    """Allocate ``model``'s parameters on ``device``, uninitialised: after ``fully_shard``,
    only this rank's shards (``to_empty``). The buffers, which ``to_empty`` also empties, get
    back the values they were built with."""
    built = dict(model.named_buffers())
    if meta := [name for name, b in built.items() if b.is_meta]:
        raise RuntimeError(f"buffers built on the meta device have no values: {meta}")
    model.to_empty(device=device)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            buf.copy_(built[name])


def load_local_shards(
    module: nn.Module,
    checkpoint: SafetensorsCheckpoint,
    prefix: str = "",
    rename: Callable[[str], str | None] | None = None,
) -> None:
    """Fill every parameter and persistent buffer of ``module`` (its state-dict entries) from
    ``checkpoint[prefix + name]``: a DTensor gets only this rank's block, in its dtype.
    ``rename``: the checkpoint's name of an entry, None for one no checkpoint has (LoRA's
    adapters, ``fill_local``'s to set; asyncrl/learner/lora/adapters.py ``base_name``).

    Names tied to one tensor (a tied LM head) are read once, from whichever the file has.
    Every entry must be found, and every tensor of the file (under ``prefix``, when given)
    must be an entry, except those transformers also ignores (``_ignored_unexpected``);
    shapes must agree. All is checked before anything is read."""
    targets = _tied_groups(module)
    if rename is not None:
        targets = {
            new: ([r for n in names if (r := rename(n)) is not None], tensor)
            for name, (names, tensor) in targets.items()
            if (new := rename(name)) is not None
        }
    keys = {name: _key_in(checkpoint, prefix, names) for name, (names, _) in targets.items()}
    claimed = {prefix + n for names, _ in targets.values() for n in names}
    ignored = _ignored_unexpected(module)
    for key in sorted(checkpoint.files):
        if prefix and not key.startswith(prefix):
            continue  # e.g. the LM head of a checkpoint whose body a critic loads
        if key not in claimed and not (ignored and ignored.search(key)):
            raise ValueError(
                f"tensor {key!r} in {checkpoint.files[key]} is no parameter or buffer of the "
                f"{type(module).__name__} built from {checkpoint.model_dir}/config.json"
            )
    for name, (_, tensor) in targets.items():
        if checkpoint.shape(keys[name]) != tuple(tensor.shape):
            raise ValueError(
                f"tensor {keys[name]!r} in {checkpoint.files[keys[name]]} has shape "
                f"{list(checkpoint.shape(keys[name]))}; the model's {name} has {list(tensor.shape)}"
            )
    with torch.no_grad():
        for name, (_, tensor) in targets.items():
            local, index = _local_block(tensor)
            if local.numel():
                local.copy_(checkpoint.read(keys[name], index))


def fill_local(
    module: nn.Module, value: Callable[[str, tuple[int, ...]], torch.Tensor | None]
) -> None:
    """Set each parameter ``name`` of ``module`` for which ``value(name, full shape)`` gives a
    tensor (the whole parameter): a DTensor takes only this rank's block of it."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            full = value(name, tuple(p.shape))
            if full is not None:
                local, index = _local_block(p)
                if local.numel():
                    local.copy_(full[index])


def _tied_groups(module: nn.Module) -> dict[str, tuple[list[str], torch.Tensor]]:
    """{first name: (every state-dict name of the tensor, the tensor)} over ``module``'s
    state dict (parameters and persistent buffers), one entry per distinct tensor."""
    groups: dict[int, tuple[list[str], torch.Tensor]] = {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        groups.setdefault(id(tensor), ([], tensor))[0].append(name)
    return {names[0]: (names, tensor) for names, tensor in groups.values()}


def _key_in(checkpoint: SafetensorsCheckpoint, prefix: str, names: list[str]) -> str:
    for name in names:
        if prefix + name in checkpoint.files:
            return prefix + name
    where = ", ".join(sorted({str(f) for f in checkpoint.files.values()}))
    raise ValueError(
        f"the model's {' = '.join(names)} is not in {checkpoint.model_dir}'s checkpoint "
        f"(looked for {', '.join(prefix + n for n in names)} in {where})"
    )


def _local_block(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[slice, ...]]:
    """(the tensor this rank writes, the index of its block in the full tensor)."""
    if not isinstance(tensor, DTensor):
        return tensor, tuple(slice(0, n) for n in tensor.shape)
    # DCP's description of the local shard: its offsets and sizes in the global tensor
    (chunk,) = tensor.__create_chunk_list__()
    local = tensor.to_local()
    if tuple(local.shape) != tuple(chunk.sizes):
        raise RuntimeError(f"local shard {tuple(local.shape)} != its block {tuple(chunk.sizes)}")
    return local, tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes, strict=True))


def _ignored_unexpected(module: nn.Module) -> re.Pattern | None:
    """Checkpoint names transformers drops without a word: the model class's
    ``_keys_to_ignore_on_load_unexpected`` and, as in its ``_adjust_missing_and_unexpected_keys``,
    old per-layer ``rotary_emb.inv_freq`` and ``position_ids`` buffers."""
    patterns = set(getattr(module, "_keys_to_ignore_on_load_unexpected", None) or ())
    buffers = [name for name, _ in module.named_buffers()]
    if any(b.endswith("rotary_emb.inv_freq") for b in buffers):
        patterns.add(r"rotary_emb\.inv_freq")
    if any(b.endswith("position_ids") for b in buffers):
        patterns.add(r"(^|\.)position_ids$")
    return re.compile("|".join(f"({p})" for p in sorted(patterns))) if patterns else None


def build_sharded(
    construct: Callable[[], nn.Module],
    shard: Callable[[nn.Module], object],
    device: torch.device,
) -> nn.Module:
    """``construct()`` with its parameters on meta, sharded by ``shard``, with this rank's
    shards allocated (uninitialised) on ``device``; the caller loads them."""
    with parameters_on_meta():
        model = construct()
    shard(model)
    materialize(model, device)
    return model
