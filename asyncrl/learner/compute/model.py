"""Load a Hugging Face causal LM and shard it with FSDP2; token log-probs; full weights.

Every learner rank calls ``build_policy``; parameters become DTensors sharded over the
default process group (gloo on CPU, NCCL on GPU, see ``learner.device``), except on a single
float32 rank without offload, which trains the plain module (``fsdp_wanted``). Parameters, gradients
and optimizer state are float32; ``model.dtype`` is the compute dtype: bfloat16 or float16
runs forward and backward in that dtype through FSDP2's ``MixedPrecisionPolicy`` (gradients
reduced in float32), the recipe of torchtitan, instead of training 16-bit weights directly.

Memory options (``model.*`` config keys, docs/architecture.md): ``logprob_chunk_tokens``, the
positions per chunk of the head in ``token_logprobs`` (no ``[B, L, V]`` logits), and
``gradient_checkpointing``, per decoder layer. Under a process group no rank loads the full
model: ``load_sharded_hf_model`` reads each rank's shards only (learner/compute/sharded_load.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from asyncrl.core.config.job import Config
from asyncrl.core.config.learner import LoraConfig
from asyncrl.learner.compute.logprobs import (  # re-exported: the learner's callers import them from here
    set_logprob_chunk_tokens,
    set_logprob_fused,
    set_logprob_temperature,
    token_logprobs,
)
from asyncrl.learner.compute.packing import set_packed

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""``model.dtype`` / ``learner.compute_dtype`` names -> torch dtypes (the critic and the weight
publisher read the same table)."""
__all__ = ["set_logprob_chunk_tokens", "set_logprob_temperature", "token_logprobs"]


def check_model_dir(model_dir: str | Path) -> Path:
    """``model_dir`` as a Path; a clear error if it is not an HF model directory."""
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model directory {path} has no config.json; set model.path to a local Hugging Face "
            "model directory (or model.path=demo for the built-in tiny model)"
        )
    return path


def attention_impl(
    setting: str, dtype: str, device: torch.device, packed: bool = False
) -> str | None:
    """transformers' ``attn_implementation``: ``auto`` is flash_attention_2 on a GPU with the
    flash-attn package and a 16-bit compute dtype (its kernels need one), else flex_attention
    on a GPU when sequences are packed (its block mask skips the blocks across rows, which
    sdpa computes and masks), else transformers' default (sdpa); any other value is passed
    through."""
    if setting != "auto":
        return setting
    import importlib.util

    if device.type == "cuda" and dtype != "float32" and importlib.util.find_spec("flash_attn"):
        return "flash_attention_2"
    if device.type == "cuda" and packed:
        return "flex_attention"
    return None


def resolve_packing(setting: bool | None, max_tokens: int, device: torch.device) -> bool:
    """``learner.pack_sequences``: null = packed on a GPU when micro-batches have a token
    budget; true / false as given (the config refuses true without a budget)."""
    if setting is None:
        return device.type == "cuda" and max_tokens > 0
    return bool(setting)


def load_hf_model(
    model_dir: str | Path, dtype: str = "float32", attn: str | None = None
) -> nn.Module:
    """Load ``model_dir`` (a local HF directory) with transformers; clear error if missing."""
    from transformers import AutoModelForCausalLM

    path = check_model_dir(model_dir)
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=DTYPES[dtype], attn_implementation=attn
    )
    model.config.use_cache = False
    return model


def shard_model(
    model: nn.Module, compute_dtype: str = "float32", layers=None, offload: bool = False
) -> nn.Module:
    """FSDP2: shard each decoder layer (``layers``, default the HF model's), then the root
    (embeddings, norm, head). A 16-bit ``compute_dtype`` casts parameters for forward/backward
    and reduces gradients in float32. ``offload`` (``learner.cpu_offload``): the sharded
    parameters, their gradients and so the optimizer state live in pinned host memory, and
    FSDP2 copies each unit's shards to the GPU for its forward/backward (GPU only: FSDP2
    needs an accelerator for it)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy()
    if compute_dtype != "float32":
        mp = MixedPrecisionPolicy(param_dtype=DTYPES[compute_dtype], reduce_dtype=torch.float32)
    kw = {"mp_policy": mp, **({"offload_policy": CPUOffloadPolicy()} if offload else {})}
    if layers is None:
        layers = decoder_layers(model)
    for layer in layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model


def check_training_dtype(dtype: str, device: torch.device) -> None:
    """``FatalError`` for ``model.dtype=float16`` on a GPU learner: the learner has no loss
    scaling (no grad scaler), so float16's narrow range underflows small gradients to zero
    and overflows large activations, and training goes wrong without an error (issue 43 round
    4). bfloat16 has float32's range. (On a CPU, a warning at launch says the same.)"""
    from asyncrl.core.runtime.fatal import FatalError

    if dtype == "float16" and device.type == "cuda":
        raise FatalError(
            "model.dtype=float16 on a GPU learner: asyncrl trains without loss scaling, so "
            "float16 gradients underflow and training degrades silently; use "
            "model.dtype=bfloat16 (GPUs from NVIDIA Ampere/A100 on). GPUs without bfloat16 "
            "(V100, T4) are not supported for training"
        )


def fsdp_wanted(compute_dtype: str = "float32", offload: bool = False) -> bool:
    """Whether a learner model is FSDP2-sharded: under a process group of 2+ ranks, or on one
    rank for what only FSDP2 gives it (a 16-bit ``compute_dtype`` over float32 master weights,
    CPU offload). One float32 rank trains the plain module: there FSDP2's hooks shard nothing
    and only cost time (the demo's default is one rank)."""
    if not dist.is_initialized():
        return False
    return dist.get_world_size() > 1 or compute_dtype != "float32" or offload


def load_sharded_hf_model(
    model_dir: str | Path,
    dtype: str,
    attn: str | None,
    device: torch.device,
    *,
    compute_dtype: str = "float32",
    trainable: bool = True,
    offload: bool = False,
    adapt: AdapterSpec | None = None,
) -> nn.Module:
    """``load_hf_model`` then ``shard_model(model, compute_dtype, offload=offload)``, without
    any rank holding the full model (learner/compute/sharded_load.py): built on the meta device,
    sharded, then each rank allocates its shards on ``device`` (on the host when
    ``offload``) and reads them from the safetensors file(s), converted to ``dtype``.
    Parameters are frozen before sharding unless ``trainable``.

    A checkpoint that cannot be read shard by shard (no safetensors, or names transformers
    converts on load) is loaded whole on every rank, as before, and rank 0 prints why.
    ``adapt`` (LoRA: ``_adapter``) changes the model before it is sharded: built on meta too,
    its base weights are read under the checkpoint's names (``base_name``) and its adapters
    set to their starting values afterwards (``initial_adapter``, the same on every rank)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from asyncrl.learner.compute import sharded_load

    path = check_model_dir(model_dir)
    config = AutoConfig.from_pretrained(path)
    checkpoint = sharded_load.open_streamable(path, config.model_type)
    home = torch.device("cpu") if offload else device  # where the shards live
    if checkpoint is None:
        model = load_hf_model(path, dtype, attn).to(home).requires_grad_(trainable)
        model = adapt.add(model) if adapt else model
        return shard_model(model, compute_dtype, offload=offload)

    def construct() -> nn.Module:
        model = AutoModelForCausalLM.from_config(
            config, dtype=DTYPES[dtype], attn_implementation=attn
        )
        model.requires_grad_(trainable)
        return adapt.add(model) if adapt else model

    shard = lambda m: shard_model(m, compute_dtype, offload=offload)  # noqa: E731
    model = sharded_load.build_sharded(construct, shard, home)
    with checkpoint:
        sharded_load.load_local_shards(model, checkpoint, rename=_base_names(adapt))
    if adapt:
        sharded_load.fill_local(model, adapt.initial)
    model.config.use_cache = False
    return model


def _base_names(adapt: AdapterSpec | None) -> Callable[[str], str | None] | None:
    """The checkpoint's names of an adapted model's entries (None: a plain model's are)."""
    if adapt is None:
        return None
    from asyncrl.learner.lora.adapters import base_name

    return base_name


def build_policy(
    model_dir: str | Path, cfg: Config | None = None, *, packed: bool = False
) -> nn.Module:
    """Load float32 master weights on the learner's device, computing in ``model.dtype``; under
    a process group that ``fsdp_wanted`` each rank loads only its shards
    (``load_sharded_hf_model``), else the plain module on the device; train mode, no dropout.

    ``model_dir``: the resolved HF directory (``model.path`` may name one to build or fetch).
    ``cfg`` (None: every key at its default) gives ``model.attn_implementation``,
    ``model.gradient_checkpointing`` (recompute each decoder layer in backward),
    ``model.logprob_chunk_tokens`` (``token_logprobs``'s chunk for this model),
    ``sampling.temperature`` (the actors' temperature, which ``token_logprobs`` scores at:
    ``set_logprob_temperature``), ``learner.cpu_offload`` (FSDP2 CPU offload, ``shard_model``)
    and ``model.compile`` (``compile_layers``, and the log-prob head's fused kernels:
    ``set_logprob_fused``). ``packed``: forwards on packed streams
    (``asyncrl.learner.compute.packing``), as ``resolve_packing`` decided for this device."""
    from asyncrl.learner.compute.device import current_device

    cfg = cfg or Config()
    mc, offload = cfg.model, cfg.learner.cpu_offload
    device = current_device()
    check_training_dtype(mc.dtype, device)
    attn_impl = attention_impl(mc.attn_implementation, mc.dtype, device, packed)
    adapt = _adapter(mc.lora, cfg.seed)
    if fsdp_wanted(mc.dtype, offload):
        model = load_sharded_hf_model(
            model_dir, "float32", attn_impl, device, compute_dtype=mc.dtype, offload=offload,
            adapt=adapt,
        )  # fmt: skip
    else:
        model = load_hf_model(model_dir, "float32", attn_impl).to(device)
        model = adapt.add(model) if adapt else model
    if mc.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    if mc.compile:
        compile_layers(model)
    set_logprob_fused(model, mc.compile)
    set_logprob_chunk_tokens(model, mc.logprob_chunk_tokens)
    set_logprob_temperature(model, cfg.sampling.temperature)
    set_packed(model, packed)
    model.train()
    return model


ADAPTER_SYNC_ATTR = "_asyncrl_adapter_sync"
"""Set on a policy whose weight syncs send the adapters alone (``model.lora.sync=adapter``)."""


@dataclass(frozen=True)
class AdapterSpec:
    """``model.lora`` for a model being built: ``add`` puts the adapters on it, ``initial``
    gives an adapter parameter's starting value by name and full shape (what a model sharded
    on the meta device is filled with: ``load_sharded_hf_model``)."""

    lora: LoraConfig
    seed: int

    def add(self, model: nn.Module) -> nn.Module:
        from asyncrl.learner.lora.adapters import add_adapters

        add_adapters(model, self.lora, self.seed)
        object.__setattr__(model, ADAPTER_SYNC_ATTR, self.lora.adapter_sync)
        return model

    def initial(self, name: str, shape: tuple[int, ...]) -> torch.Tensor | None:
        from asyncrl.learner.lora.adapters import initial_adapter

        return initial_adapter(name, shape, self.seed) if ".lora_" in name else None


def _adapter(lora: LoraConfig, seed: int) -> AdapterSpec | None:
    """``model.lora``'s ``AdapterSpec`` (None when off)."""
    return AdapterSpec(lora, seed) if lora.enabled else None


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The HF model's decoder layers (``model.model.layers``, or ``model.layers`` for a base
    model); empty if it has none."""
    return list(getattr(getattr(model, "model", model), "layers", []))


def compile_layers(model: nn.Module) -> int:
    """``torch.compile`` each decoder layer's ``forward`` (``model.compile``); returns how many.

    The layer's call stays eager: FSDP2's hooks around it and transformers' gradient
    checkpointing (which recomputes through the compiled forward) are untouched. Every layer
    runs the same code, and parameters are graph inputs (dynamo's default), so one compiled
    graph serves all of them. Compiled graphs are not read back from torch's on-disk caches
    (``compile_without_pickled_caches``: they are pickles). Same values as eager up to float
    rounding (tests/unit/learner/test_compile_layers.py)."""
    from asyncrl.learner.compute.packing import compile_without_pickled_caches

    compile_without_pickled_caches()
    layers = decoder_layers(model)
    for layer in layers:
        layer.forward = torch.compile(layer.forward)
    return len(layers)


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Keep only each decoder layer's input in forward and recompute the layer in backward
    (transformers' per-layer checkpointing, non-reentrant ``torch.utils.checkpoint``), in
    train mode. Composes with FSDP2, before or after ``shard_model`` (both tested): the
    layer's FSDP hooks run inside the checkpointed call, and on the recompute FSDP2 is in its
    pre-backward state, where the parameters are already gathered and its hooks do no more."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def full_named_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, full tensor) for every parameter and buffer in the state dict; with
    LoRA adapters (``model.lora``) the merged weights under the base model's names
    (``asyncrl.learner.lora.merge``), so actors and exports get an ordinary HF model.

    Collective: every rank must iterate it (DTensor ``full_tensor`` all-gathers).
    """
    from asyncrl.learner.lora.adapters import lora_scale
    from asyncrl.learner.lora.merge import merged

    scale = lora_scale(model)
    gathered = state_tensors(model)
    yield from gathered if scale is None else merged(gathered, scale)


def sync_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """What a weight sync sends: with adapters made for ``model.lora.sync=adapter`` the
    adapters alone under PEFT's names (``asyncrl.learner.lora.peft_export.adapter_tensors``;
    the actors write them as a LoRA adapter), else ``full_named_tensors``. Collective."""
    from asyncrl.learner.lora.peft_export import adapter_tensors

    if not getattr(model, ADAPTER_SYNC_ATTR, False):
        yield from full_named_tensors(model)
        return
    yield from adapter_tensors(state_tensors(model, only=lambda name: ".lora_" in name)).items()


def state_tensors(
    model: nn.Module, only: Callable[[str], bool] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, full tensor) of the state dict as it is (LoRA: base and adapter tensors
    under peft's names), those whose name passes ``only`` if given (the others are not
    gathered). Collective, as ``full_named_tensors``: every rank passes the same ``only``."""
    for name, tensor in model.state_dict().items():
        if only is not None and not only(name):
            continue
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        yield name, full.detach()
