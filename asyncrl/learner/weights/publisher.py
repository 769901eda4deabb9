"""Rank 0's weight publisher: the control plane the actors register with, the weight channel
to them, and the newest version it sent (the buffer's ``weights_sent_max``: groups of a
newer version are foreign, learner/hub/data.py).

``WeightPublisher`` is the real one; tests/fakes/learner.py has its fake for unit tests
(it records the versions it was given). Both satisfy ``Publisher``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from asyncrl.core.config.job import Config
from asyncrl.core.net.control import ControlServer
from asyncrl.core.runtime.waiting import Wait

if TYPE_CHECKING:
    from asyncrl.buffer.faces import LearnerBuffer


class Publisher(Protocol):
    """What the hub asks of its weight publisher."""

    sent_max: int
    """The newest version sent to actors in this run (a restart of the run sets it)."""

    def attempt(self, named, version: int, attempt: int) -> bool:
        """One try of a sync; True when another try should follow."""

    def faults(self) -> tuple[int, int]:
        """(failed tries, weight groups re-formed) so far in this run."""

    def last_sync(self) -> tuple[int, float]:
        """(bytes, seconds since its first try) of the sync that just succeeded."""

    def meta(self) -> dict:
        """The buffer meta that tells actors where the control plane is."""

    def open(self) -> None:
        """Wait for the actors; open the weight channel to them."""

    def rejoin_pending(self) -> bool: ...

    def settle(self) -> None: ...

    def stop_actors(self) -> None: ...

    def close(self) -> None: ...


class WeightPublisher:
    """The control server (every actor follows the learner through it, with or without
    weight sync) and, once ``open`` saw the actors register, the ``ActorWeightChannel``."""

    def __init__(
        self,
        cfg: Config,
        buffer: LearnerBuffer,
        say: Callable[[str], None],
        stop: Callable[[], bool],
    ) -> None:
        self.cfg, self.buffer, self.say, self.stop = cfg, buffer, say, stop
        net = cfg.network
        self.control = ControlServer(net.bind, advertise=net.advertise)
        self.sender = None
        self.sent_max = -1  # the newest version sent to actors in this run (weights_sent_max)
        self._t0 = 0.0  # when the sync under way began (its first try)

    def open(self) -> None:
        """Wait for every actor to register, then open the weight channel to them."""
        cfg = self.cfg
        self.say(f"control plane on {self.control.address}")
        wait = Wait(
            f"{cfg.actor.total} actor(s) to register",
            cfg.learner.actor_wait_s,
            self.say,
            self.stop,
            hint=(
                "start them with `asyncrl launch actors` pointed at the same buffer.url "
                f"and buffer.name ({cfg.buffer.name!r}), or raise learner.actor_wait_s"
            ),
        )
        wait.begin()
        self.control.wait_for_actors(cfg.actor.total, wait)
        check_actor_ids(sorted(self.control.actors), cfg)
        self.sender = open_weight_channel(self.control, cfg, self.say, self.stop)

    def attempt(self, named, version: int, attempt: int) -> bool:
        if attempt == 0:
            self._t0 = time.monotonic()
            if version > self.sent_max:  # before any actor can hold it (learner/hub/data.py)
                self.sent_max = version
                self.buffer.set_meta(weights_sent_max=version)
        return self.sender.attempt(named, version, attempt)  # re-forms a broken group

    def faults(self) -> tuple[int, int]:
        return self.sender.failures, self.sender.rebuilds

    def last_sync(self) -> tuple[int, float]:
        return self.sender.last_stats.bytes, time.monotonic() - self._t0

    def rejoin_pending(self) -> bool:
        """Did an actor register again (restarted, relaunched on its host, or back after a
        partition) and wait for weights? Then the learner syncs before reading on."""
        return self.sender is not None and self.sender.rejoin_pending()

    def settle(self) -> None:
        """Wait until the actors loaded the last sync (its deferred ack)."""
        if self.sender is not None:
            self.sender.settle()

    def meta(self) -> dict:
        return self.control.meta()

    def stop_actors(self) -> None:
        self.control.broadcast({"type": "stop"})

    def close(self) -> None:
        """Close the weight channel and the control server."""
        if self.sender is not None:
            self.sender.close()
        self.control.close()


def open_weight_channel(control: ControlServer, cfg: Config, say, stop=lambda: False):
    """Tell every actor where to join the weight group, then host it as rank 0.

    ``learner.weight_transport`` picks the transport (``auto``: nccl for a learner on a GPU
    feeding vLLM actors; else shm when the network is loopback, so every actor is on this
    host; else gloo; asyncrl/core/weights/). Each actor takes ``actor.tensor_parallel_size``
    receiver ranks, one per vLLM worker. The channel re-forms the group with the live actors
    when a receiver dies, and takes a restarted actor back (learner/weights/channel.py)."""
    from asyncrl.core.weights import transports
    from asyncrl.learner.compute.device import current_device
    from asyncrl.learner.compute.model import DTYPES
    from asyncrl.learner.weights.channel import ActorWeightChannel, ChannelOptions

    device = current_device()
    # a shared GPU (learner.share_gpu): NCCL cannot join two ranks on one device
    gpus_both_ends = (
        device.type == "cuda" and cfg.actor.engine == "vllm" and not cfg.learner.share_gpu
    )
    name = transports.resolve(cfg.learner.weight_transport, gpus_both_ends, cfg.network.local)
    # float32 masters go out in the actors' dtype (model.dtype): half the bytes for bf16
    options = ChannelOptions(
        transport=name,
        timeout_s=cfg.learner.weight_sync_timeout_s,
        wire_dtype=DTYPES[cfg.model.dtype],
        network=cfg.network,
        workers_per_actor=cfg.actor.tensor_parallel_size,
        device=device,
        defer_ack=cfg.learner.defer_weight_ack,
    )
    channel = ActorWeightChannel(control, options, log=say, stop=stop)
    say(f"weights travel over {name} (learner.weight_transport={cfg.learner.weight_transport})")
    return channel.open()


def check_actor_ids(ids: list[int], cfg: Config) -> None:
    """Actors' ids run 0 .. total-1 for the total the actors were given: a larger id means the
    learner was told fewer actors than run (it would ignore some and misjudge exhaustion)."""
    extra = [i for i in ids if i >= cfg.actor.total]
    if extra:
        raise ValueError(
            f"actor id(s) {extra} registered, but this learner expects {cfg.actor.total} "
            f"actor(s) (actor.num_actors={cfg.actor.num_actors} x actor.nnodes="
            f"{cfg.actor.nnodes}); give the learner the actors' actor.num_actors and actor.nnodes"
        )
