"""vLLM's trainer-side weight-transfer API over one of our transports' senders.

``AsyncrlTrainerWeightTransferEngine`` is registered as ``"asyncrl"`` in vLLM's
``WeightTransferTrainerFactory`` by ``asyncrl.actors.vllm_plugin``, for code written against vLLM's
own trainer API. The learner itself uses ``asyncrl.learner.weight_sender.ActorWeightChannel``; this
module imports vLLM, so nothing in the learner's own import path imports it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import ClassVar

from vllm.distributed.weight_transfer.base import TrainerInitInfo, TrainerWeightTransferEngine

from asyncrl.core import transports
from asyncrl.core.config_network import NetworkConfig
from asyncrl.core.transports.base import Sender
from asyncrl.core.weights import DEFAULT_BUCKET_BYTES, DEFAULT_TIMEOUT_S, LOOPBACK


@dataclass
class AsyncrlTrainerInitInfo(TrainerInitInfo):
    """Trainer init info for the ``asyncrl`` backend (``rank`` 0 is the sender):
    ``transport`` (asyncrl.core.transports), where it binds (``master_address``), the group size."""

    backend: ClassVar[str] = "asyncrl"
    transport: str = "gloo"
    master_address: str = LOOPBACK
    world_size: int = 2
    timeout_s: float = DEFAULT_TIMEOUT_S
    bucket_bytes: int = field(default=DEFAULT_BUCKET_BYTES)


class AsyncrlTrainerWeightTransferEngine(TrainerWeightTransferEngine[AsyncrlTrainerInitInfo]):
    """vLLM-API wrapper over a transport ``Sender``: drives the worker RPCs via ``client``.

    ``send_weights(version)`` replays the ``WeightSource`` once; without a version it
    sends ``last version + 1``. Non-sender ranks only iterate the source (FSDP gathers).
    """

    init_info_cls = AsyncrlTrainerInitInfo

    def __init__(self, *, client, source, is_sender: bool = True, sender=None):
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.sender: Sender | None = sender
        self.version = 0

    @classmethod
    def trainer_init(cls, init_info, *, client, source=None):
        if source is None:
            raise ValueError("asyncrl trainer weight transfer requires a WeightSource")
        if not init_info.is_sender:
            return cls(client=client, source=source, is_sender=False)
        sender = transports.sender(
            init_info.transport, bucket_bytes=init_info.bucket_bytes, timeout_s=init_info.timeout_s
        )
        net = NetworkConfig(bind=init_info.master_address)
        info = {**sender.open(init_info.world_size, net), "rank_offset": 1}
        # Workers block in the rendezvous inside this RPC, so run it beside connect().
        with ThreadPoolExecutor(max_workers=1) as exe:
            fut = exe.submit(client.init_weight_transfer_engine, info)
            sender.connect()
            fut.result()
        return cls(client=client, source=source, sender=sender)

    def send_weights(self, version: int | None = None) -> None:
        self.version = self.version + 1 if version is None else version
        if not self.is_sender:
            for _ in self.source:
                pass
            return
        assert self.sender is not None
        self.client.start_weight_update()
        exe = ThreadPoolExecutor(max_workers=1)
        try:
            fut = exe.submit(self.client.update_weights, {"version": self.version})
            self.sender.send(iter(self.source), self.version)
            fut.result()
        finally:
            exe.shutdown(wait=False)  # a failed worker RPC must not turn into a hang
        self.client.finish_weight_update(weight_version=str(self.version))

    def shutdown(self) -> None:
        if self.sender is not None:
            self.sender.close()
