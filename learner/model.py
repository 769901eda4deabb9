"""Load a Hugging Face causal LM and shard it with FSDP2; token log-probs; full weights.

Every learner rank calls ``build_policy``; parameters become DTensors sharded over the
default process group (gloo on CPU, NCCL on GPU, see ``learner.device``). Parameters, gradients
and optimizer state are float32; ``model.dtype`` is the compute dtype: bfloat16 or float16
runs forward and backward in that dtype through FSDP2's ``MixedPrecisionPolicy`` (gradients
reduced in float32), the recipe of torchtitan, instead of training 16-bit weights directly.

Memory options (``model.*`` config keys, docs/architecture.md): ``logprob_chunk_tokens``, the
positions per chunk of the head in ``token_logprobs`` (no ``[B, L, V]`` logits), and
``gradient_checkpointing``, per decoder layer. Under a process group no rank loads the full
model: ``load_sharded_hf_model`` reads each rank's shards only (learner/sharded_load.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import MethodType

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method

from asyncrl.config import ModelConfig
from learner.logprobs import chunked_token_logprobs
from learner.packing import is_packed, pack, packed_forward, set_packed

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_PLAIN_HEAD_MODELS = frozenset({"llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"})
"""HF model types whose causal-LM logits are ``lm_head(final hidden states)`` and nothing more
(read in transformers 5.19); the chunked ``token_logprobs`` rebuilds exactly that. Others
(Gemma's soft-capping, Cohere's and Granite's logit scales, ...) take the full-logits path."""
_CHUNK_ATTR = "logprob_chunk_tokens"  # set on the model by build_policy / build_reference
_TEMPERATURE_ATTR = "logprob_temperature"  # set_logprob_temperature
_ROOT_METHOD = "_asyncrl_hidden_logprobs"  # the FSDP2 forward method (_run_chunked)


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
        path, dtype=_DTYPES[dtype], attn_implementation=attn
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
        mp = MixedPrecisionPolicy(param_dtype=_DTYPES[compute_dtype], reduce_dtype=torch.float32)
    kw = {"mp_policy": mp, **({"offload_policy": CPUOffloadPolicy()} if offload else {})}
    if layers is None:
        layers = getattr(getattr(model, "model", model), "layers", [])
    for layer in layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model


def load_sharded_hf_model(
    model_dir: str | Path,
    dtype: str,
    attn: str | None,
    device: torch.device,
    *,
    compute_dtype: str = "float32",
    trainable: bool = True,
    offload: bool = False,
) -> nn.Module:
    """``load_hf_model`` then ``shard_model(model, compute_dtype, offload=offload)``, without
    any rank holding the full model (learner/sharded_load.py): built on the meta device,
    sharded, then each rank allocates its shards on ``device`` (on the host when
    ``offload``) and reads them from the safetensors file(s), converted to ``dtype``.
    Parameters are frozen before sharding unless ``trainable``.

    A checkpoint that cannot be read shard by shard (no safetensors, or names transformers
    converts on load) is loaded whole on every rank, as before, and rank 0 prints why."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from learner import sharded_load

    path = check_model_dir(model_dir)
    config = AutoConfig.from_pretrained(path)
    checkpoint = sharded_load.open_streamable(path, config.model_type)
    home = torch.device("cpu") if offload else device  # where the shards live
    if checkpoint is None:
        model = load_hf_model(path, dtype, attn).to(home).requires_grad_(trainable)
        return shard_model(model, compute_dtype, offload=offload)

    def construct() -> nn.Module:
        model = AutoModelForCausalLM.from_config(
            config, dtype=_DTYPES[dtype], attn_implementation=attn
        )
        return model.requires_grad_(trainable)

    shard = lambda m: shard_model(m, compute_dtype, offload=offload)  # noqa: E731
    model = sharded_load.build_sharded(construct, shard, home)
    with checkpoint:
        sharded_load.load_local_shards(model, checkpoint)
    model.config.use_cache = False
    return model


def build_policy(
    model_dir: str | Path,
    dtype: str = "float32",
    attn: str = "auto",
    *,
    gradient_checkpointing: bool = False,
    logprob_chunk_tokens: int | None = None,
    temperature: float = 1.0,
    packed: bool = False,
    offload: bool = False,
) -> nn.Module:
    """Load float32 master weights on the learner's device, computing in ``dtype``; under a
    process group each rank loads only its shards (``load_sharded_hf_model``); train mode, no
    dropout. ``gradient_checkpointing``: recompute each decoder layer in backward;
    ``logprob_chunk_tokens``: ``token_logprobs``'s chunk for this model (None = the config
    default); ``temperature``: the actors' sampling temperature, which ``token_logprobs``
    scores at (``set_logprob_temperature``); ``packed``: forwards on packed streams
    (``learner.packing``); ``offload``: FSDP2 CPU offload (``shard_model``)."""
    from learner.device import current_device

    device = current_device()
    attn_impl = attention_impl(attn, dtype, device, packed)
    if dist.is_initialized():
        model = load_sharded_hf_model(model_dir, "float32", attn_impl, device,
                                      compute_dtype=dtype, offload=offload)  # fmt: skip
    else:
        model = load_hf_model(model_dir, "float32", attn_impl).to(device)
    if gradient_checkpointing:
        enable_gradient_checkpointing(model)
    set_logprob_chunk_tokens(model, logprob_chunk_tokens)
    set_logprob_temperature(model, temperature)
    set_packed(model, packed)
    model.train()
    return model


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Keep only each decoder layer's input in forward and recompute the layer in backward
    (transformers' per-layer checkpointing, non-reentrant ``torch.utils.checkpoint``), in
    train mode. Composes with FSDP2, before or after ``shard_model`` (both tested): the
    layer's FSDP hooks run inside the checkpointed call, and on the recompute FSDP2 is in its
    pre-backward state, where the parameters are already gathered and its hooks do no more."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def set_logprob_chunk_tokens(model: nn.Module, tokens: int | None) -> None:
    """``token_logprobs(model, ...)``'s positions per chunk of the head (None = the config
    default; 0 = the full ``[B, L, V]`` logits at once)."""
    if tokens is not None and tokens < 0:
        raise ValueError(f"logprob_chunk_tokens must be >= 0, got {tokens}")
    setattr(model, _CHUNK_ATTR, ModelConfig.logprob_chunk_tokens if tokens is None else tokens)


def set_logprob_temperature(model: nn.Module, temperature: float) -> None:
    """Score ``model``'s distribution at ``temperature`` (logits / T) in ``token_logprobs``.

    The actors sample at ``actor.temperature`` and report the log-probs of the tempered
    distribution (vLLM ``logprobs_mode="processed_logprobs"``), so pi_theta must be tempered
    alike or the importance ratio pi_theta / pi_behave compares two different distributions
    (verl divides its logits by the rollout temperature the same way). The actors sample
    without top-p/top-k (actors/engine.py), so nothing else separates the two."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    setattr(model, _TEMPERATURE_ATTR, float(temperature))


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    entropy: bool = True,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each next token and the per-position entropy.

    The final hidden states go through the head ``chunk_tokens`` positions at a time, in
    forward and in backward (``learner.logprobs``), so no ``[B, L, V]`` tensor is built;
    positions whose target is padding are skipped. ``chunk_tokens=0``, or a model whose
    logits are more than ``lm_head(hidden)`` (``_PLAIN_HEAD_MODELS``), takes the full-logits
    path: same values, with ``B * L * V`` memory. Collective under FSDP2.

    Args:
        input_ids: [B, L] right-padded sequences (prompt + completion).
        attention_mask: [B, L] 1 on real tokens.
        entropy: False skips the entropy (returned as None).
        chunk_tokens: positions per chunk; None = the model's (``set_logprob_chunk_tokens``,
            default ``ModelConfig.logprob_chunk_tokens``).
    Returns:
        (logprobs [B, L-1], entropy [B, L-1] or None), float32; position t scores token
        ``input_ids[:, t+1]``; 0 where that token is padding (``attention_mask[:, t+1] == 0``).
    """
    if chunk_tokens is None:
        chunk_tokens = getattr(model, _CHUNK_ATTR, ModelConfig.logprob_chunk_tokens)
    temperature = getattr(model, _TEMPERATURE_ATTR, 1.0)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if chunk_tokens == 0 or model_type not in _PLAIN_HEAD_MODELS:
        return _full_logits_logprobs(model, input_ids, attention_mask, entropy, temperature)
    return _run_chunked(model, input_ids, attention_mask, chunk_tokens, entropy, temperature)


def _full_logits_logprobs(model, input_ids, attention_mask, entropy, temperature=1.0):
    """The plain path: ``model(...).logits`` ([B, L, V]) and ``log_softmax`` over all of it."""
    if is_packed(model):
        return _packed_full_logits(model, input_ids, attention_mask, entropy, temperature)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
    logprobs = logp_all.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    scored, zero = attention_mask[:, 1:] != 0, logprobs.new_zeros(())
    if not entropy:
        return torch.where(scored, logprobs, zero), None
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return torch.where(scored, logprobs, zero), torch.where(scored, ent, zero)


def _packed_full_logits(model, input_ids, attention_mask, entropy, temperature):
    """``_full_logits_logprobs`` on the packed stream (``learner.packing``): ``[S, V]`` logits,
    scored where the next token is in the same row."""
    packed = pack(input_ids, attention_mask)
    at = packed.scored()
    logits = packed_forward(model, packed).logits[0, at]
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
    targets = packed.input_ids[0, at + 1]
    logprobs = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1) if entropy else None
    return packed.to_grid(logprobs, at), (None if ent is None else packed.to_grid(ent, at))


def _run_chunked(model, *args):
    """``_hidden_logprobs(model, *args)``; on an FSDP2 root, as a registered FSDP forward method.

    ``shard_model`` leaves the embeddings, the final norm and the head (tied or not) to the
    root's FSDP unit, whose hooks gather them only around ``model.forward``. Outside it,
    ``model.model`` and ``lm_head.weight`` are sharded DTensors. ``register_fsdp_forward_method``
    runs the root's pre/post-forward hooks around ``_hidden_logprobs`` as around ``forward``:
    the root's parameters are gathered (in the compute dtype), the head weight the chunks
    read is the unsharded parameter the autograd graph then holds, the pre-backward hook
    re-gathers it for the backward's recompute of the chunks, and the head's gradient is
    reduce-scattered with the rest of the root's at the end of backward. Registered once per
    model, on its first call.
    """
    if not isinstance(model, FSDPModule):
        return _hidden_logprobs(model, *args)
    if _ROOT_METHOD not in vars(model):
        setattr(model, _ROOT_METHOD, MethodType(_hidden_logprobs, model))
        register_fsdp_forward_method(model, _ROOT_METHOD)
    return getattr(model, _ROOT_METHOD)(*args)


def _hidden_logprobs(model, input_ids, attention_mask, chunk_tokens, entropy, temperature=1.0):
    """``token_logprobs`` from the final hidden states: only positions whose target is a real
    token go through the head; the rest of the [B, L-1] grid is 0. ``(h / T) W^T`` is the
    tempered logits ``z / T`` exactly (no bias in these heads)."""
    if is_packed(model):
        return _packed_hidden_logprobs(model, input_ids, attention_mask, chunk_tokens, entropy,
                                       temperature)  # fmt: skip
    b, length = input_ids.shape
    out = model.base_model(input_ids=input_ids, attention_mask=attention_mask)
    hidden = out.last_hidden_state.flatten(0, 1)  # [B*L, H], after the final norm
    scored = torch.zeros_like(input_ids, dtype=torch.bool)
    scored[:, :-1] = attention_mask[:, 1:] != 0
    idx = scored.flatten().nonzero().squeeze(1)  # flat (b, t); its target is at idx + 1
    weight = model.get_output_embeddings().weight
    targets = input_ids.flatten()[idx + 1]
    h = hidden[idx] if temperature == 1.0 else hidden[idx] / temperature
    lp, ent = chunked_token_logprobs(h, weight, targets, chunk_tokens, entropy)

    def grid(values):  # [n] -> [B, L-1], 0 off ``idx``; a fresh tensor (FSDP hooks its outputs)
        full = values.new_zeros(b * length).index_copy(0, idx, values)
        return full.view(b, length)[:, :-1].contiguous()

    return grid(lp), (None if ent is None else grid(ent))


def _packed_hidden_logprobs(model, input_ids, attention_mask, chunk_tokens, entropy, temperature):
    """``_hidden_logprobs`` on the packed stream: the head sees the positions whose next
    token is in the same row."""
    packed = pack(input_ids, attention_mask)
    hidden = packed_forward(model.base_model, packed).last_hidden_state[0]  # [S, H]
    at = packed.scored()
    h = hidden[at] if temperature == 1.0 else hidden[at] / temperature
    weight = model.get_output_embeddings().weight
    lp, ent = chunked_token_logprobs(h, weight, packed.input_ids[0, at + 1], chunk_tokens, entropy)
    return packed.to_grid(lp, at), (None if ent is None else packed.to_grid(ent, at))


def full_named_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, full tensor) for every parameter and buffer in the state dict.

    Collective: every rank must iterate it (DTensor ``full_tensor`` all-gathers).
    """
    for name, tensor in model.state_dict().items():
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        yield name, full.detach()
