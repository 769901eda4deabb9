"""Worker side of every weight transport: a vLLM ``WeightTransferEngine`` named ``"asyncrl"``.

Shaped like vLLM's dense ``nccl`` engine (``vllm/distributed/weight_transfer/nccl_engine.py``):
``init_transfer_engine`` joins the trainer's group, ``start_weight_update`` /
``finish_weight_update`` bracket vLLM's layerwise reload, ``receive_weights`` streams buckets
into ``model.load_weights``. Which transport moves the bytes (``gloo`` on the host, ``nccl``
on the worker's GPU) is named by the learner in the init info and built from
``asyncrl.core.weights.transports``; this engine does not change when a transport is added.

Registered inside every vLLM process by ``asyncrl.actors.weights.plugin.register`` (a
``vllm.general_plugins`` entry point), because the worker lives in a child process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.logger import init_logger

from asyncrl.core.weights import transports
from asyncrl.core.weights.stream import WeightSyncError

logger = init_logger(__name__)


def write_adapter_dir(out: Path, tensors: dict[str, torch.Tensor], config: dict) -> None:
    """``out/adapter_model.safetensors`` and ``out/adapter_config.json`` (PEFT's format, as
    vLLM's ``LoRARequest`` reads it), written into a temporary directory then renamed, so a
    reader never sees half an adapter. The adapted modules are those the tensors name."""
    import json
    import os
    import shutil

    from safetensors.torch import save_file

    if not tensors:
        raise WeightSyncError(f"adapter sync to {out}: no tensors arrived")
    modules = sorted({n.rsplit(".lora_", 1)[0].rsplit(".", 1)[-1] for n in tensors})
    peft = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "bias": "none", "use_rslora": False,
            "use_dora": False, "fan_in_fan_out": False, "lora_dropout": 0.0,
            "modules_to_save": None, "target_modules": modules, **config}  # fmt: skip
    tmp = out.with_name(f".tmp-{out.name}")
    tmp.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
    (tmp / "adapter_config.json").write_text(json.dumps(peft))
    if out.exists():  # a retried sync of the same version
        shutil.rmtree(out)
    os.replace(tmp, out)


@dataclass
class AsyncrlWeightTransferInitInfo(WeightTransferInitInfo):
    """A transport's ``weights_init`` (asyncrl/core/weights/base.py): this worker takes rank
    ``rank_offset + worker rank`` (worker rank counts TP/PP workers across data-parallel
    replicas, as in vLLM's nccl engine). ``fields`` is the transport's own JSON."""

    transport: str
    rank_offset: int = 1
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class AsyncrlWeightTransferUpdateInfo(WeightTransferUpdateInfo):
    """One sync: the version the worker expects the trainer to send (checked per bucket).
    With adapter-only sync (``model.lora.sync=adapter``) the tensors are a LoRA adapter, to
    be written in PEFT's format into ``adapter_dir`` with ``adapter_config``'s ``r`` and
    ``lora_alpha`` (asyncrl/actors/engine/adapters.py), not loaded into the model."""

    version: int
    adapter_dir: str = ""
    adapter_config: dict[str, Any] = field(default_factory=dict)


class AsyncrlWeightTransferEngine(
    WeightTransferEngine[AsyncrlWeightTransferInitInfo, AsyncrlWeightTransferUpdateInfo]
):
    """Receives full checkpoint-format (HF-named) tensors through a transport's receiver."""

    init_info_cls = AsyncrlWeightTransferInitInfo
    update_info_cls = AsyncrlWeightTransferUpdateInfo

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.receiver: transports.Receiver | None = None
        self.last_version: int | None = None

    def parse_init_info(self, init_dict: dict[str, Any]) -> AsyncrlWeightTransferInitInfo:
        """The transport name and rank offset; every other key is the transport's."""
        rest = {k: v for k, v in init_dict.items() if k not in ("transport", "rank_offset")}
        if "transport" not in init_dict:
            raise WeightSyncError(f"weights_init names no transport: {sorted(init_dict)}")
        return AsyncrlWeightTransferInitInfo(
            init_dict["transport"], int(init_dict.get("rank_offset", 1)), rest
        )

    def init_transfer_engine(self, init_info: AsyncrlWeightTransferInitInfo) -> None:
        """Join (or re-join, after a failure) the trainer's group; blocks until it forms."""
        self.shutdown()
        pc = self.parallel_config
        worker_rank = pc.data_parallel_index * pc.world_size + pc.rank
        try:
            receiver = transports.receiver(init_info.transport)
        except ValueError as e:
            raise WeightSyncError(str(e)) from e
        receiver.join(init_info.fields, init_info.rank_offset + worker_rank, self.device)
        self.receiver = receiver

    def start_weight_update(self) -> None:
        """Put the model in layerwise-reload mode (parameters restored from meta per layer)."""
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        """Process any layers not finished during loading and leave reload mode.

        Here vLLM logs ``RotaryEmbedding: Failed to load weights`` at every sync, harmlessly:
        layerwise reload expects every tensor of a layer to be loaded, buffers included, and
        the rotary embedding's one tensor is ``cos_sin_cache``, a non-persistent buffer
        computed from the config (head size, rope theta, positions) that no checkpoint holds
        and training never changes. Finding nothing loaded for it, vLLM puts the layer's own
        tensors back (``_place_kernel_tensors``): the cache it had before the sync. vLLM's
        ``get_rope`` shares one such layer across the decoder layers, hence one line per
        sync; a layer that has parameters and logs it is a real failure.
        tests/integration/test_smollm2.py checks every position's log-prob after a sync."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict) -> None:
        """Base class minus ``torch.accelerator.synchronize()``: every transport's receive
        returns only once its collectives completed, and there may be no accelerator."""
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: AsyncrlWeightTransferUpdateInfo) -> None:
        """Receive one versioned sync. On failure the layerwise reload is finalized so the
        model is structurally whole again (its values may be a mix; the caller must not
        generate until a later sync succeeds), then the error is raised."""
        if self.receiver is None:
            raise WeightSyncError(
                "weight transfer not initialized; call init_weight_transfer_engine first"
            )
        from vllm.model_executor.model_loader.mtp_validation import (
            disable_mtp_completeness_check,
        )

        if update_info.adapter_dir:
            nbytes, count = self._receive_adapter(update_info)
            self.last_version = update_info.version
            logger.info(
                "adapter sync v%d: %d tensors, %.2f MB", update_info.version, count, nbytes / 1e6
            )
            return
        try:
            with disable_mtp_completeness_check(), torch.no_grad():
                nbytes, count = self.receiver.receive(update_info.version, self.model.load_weights)
        except Exception:
            self.finish_weight_update()
            raise
        self.last_version = update_info.version
        logger.info(
            "weight sync v%d: %d tensors, %.1f MB", update_info.version, count, nbytes / 1e6
        )

    def _receive_adapter(self, info: AsyncrlWeightTransferUpdateInfo) -> tuple[int, int]:
        """Receive a version's adapter tensors (PEFT names, ``base_model.model.X.lora_A.weight``)
        and write them with their config; the first worker of a replica writes, every worker
        receives (the stream is a collective). The model is not touched."""
        assert self.receiver is not None
        tensors: dict[str, torch.Tensor] = {}

        def keep(named) -> None:  # views into the bucket: copied out
            for name, t in named:
                tensors[name] = t.detach().to("cpu", copy=True)

        nbytes, count = self.receiver.receive(info.version, keep)
        if self.parallel_config.rank == 0:
            write_adapter_dir(Path(info.adapter_dir), tensors, info.adapter_config)
        return nbytes, count

    def shutdown(self) -> None:
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None


ADAPTER_EXTENSION = "asyncrl.actors.weights.receiver.AdapterReceiver"
"""vLLM's ``worker_extension_cls`` for engines with adapter-only sync (a class name, imported
in each worker: nothing is pickled)."""


class AdapterReceiver:
    """Mixed into vLLM's worker (``worker_extension_cls``): ``receive_adapter`` receives one
    version's adapter through the weight engine, outside vLLM's weight-update session, whose
    end (``finish_weight_update``) would reload the layers and drop every loaded adapter,
    those of the requests in flight included. Called with ``AsyncLLM.collective_rpc``."""

    weight_transfer_engine: AsyncrlWeightTransferEngine | None

    def receive_adapter(self, update_info: dict) -> None:
        engine = self.weight_transfer_engine
        if engine is None:
            raise WeightSyncError("no weight transfer engine: start vLLM with weight sync on")
        info = engine.parse_update_info(update_info)
        if not info.adapter_dir:
            raise WeightSyncError(f"receive_adapter without an adapter_dir: {update_info}")
        engine.receive_weights(info)
