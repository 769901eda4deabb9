"""Rank 0's weight publisher: the control plane the actors register with, the weight channel
to them, and the newest version it sent (the buffer's ``weights_sent_max``: groups of a
newer version are foreign, learner/data.py).

``WeightPublisher`` is the real one; ``RecordingPublisher`` its fake for unit tests (it
records the versions it was given). Both satisfy ``Publisher``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from asyncrl.core.config import Config
from asyncrl.core.control import ControlServer
from asyncrl.core.waiting import Wait


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

    def __init__(self, cfg: Config, buffer, say: Callable[[str], None], stop) -> None:
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
            if version > self.sent_max:  # before any actor can hold it (learner/data.py)
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


class RecordingPublisher:
    """A ``Publisher`` that sends nothing and records each version it was given (unit tests);
    ``fail_first`` tries of each sync fail and are retried."""

    def __init__(self, fail_first: int = 0, nbytes: int = 1) -> None:
        self.versions: list[int] = []
        self.fail_first, self.nbytes = fail_first, nbytes
        self.failures = self.settled = 0
        self.sent_max = -1
        self.events: list[str] = []

    def meta(self) -> dict:
        return {"control": "recording"}

    def open(self) -> None:
        self.events.append("open")

    def stop_actors(self) -> None:
        self.events.append("stop_actors")

    def close(self) -> None:
        self.events.append("close")

    def attempt(self, named, version: int, attempt: int) -> bool:
        for _ in named:  # take part in the gather, as the real one does
            pass
        if attempt < self.fail_first:
            self.failures += 1
            return True
        self.versions.append(version)
        return False

    def faults(self) -> tuple[int, int]:
        return self.failures, self.failures

    def last_sync(self) -> tuple[int, float]:
        return self.nbytes, 0.0

    def rejoin_pending(self) -> bool:
        return False

    def settle(self) -> None:
        self.settled += 1


def open_weight_channel(control: ControlServer, cfg: Config, say, stop=lambda: False):
    """Tell every actor where to join the weight group, then host it as rank 0.

    ``learner.weight_transport`` picks the transport (``auto``: nccl for a learner on a GPU
    feeding vLLM actors; else shm when the network is loopback, so every actor is on this
    host; else gloo; asyncrl/core/transports/). Each actor takes ``actor.tensor_parallel_size``
    receiver ranks, one per vLLM worker. The channel re-forms the group with the live actors
    when a receiver dies, and takes a restarted actor back (learner/weight_sender.py)."""
    from asyncrl.core import transports
    from asyncrl.learner.device import current_device
    from asyncrl.learner.model import _DTYPES
    from asyncrl.learner.weight_sender import ActorWeightChannel

    device = current_device()
    # a shared GPU (learner.share_gpu): NCCL cannot join two ranks on one device
    gpus_both_ends = (
        device.type == "cuda" and cfg.actor.engine == "vllm" and not cfg.learner.share_gpu
    )
    name = transports.resolve(cfg.learner.weight_transport, gpus_both_ends, cfg.network.local)
    # float32 masters go out in the actors' dtype (model.dtype): half the bytes for bf16
    channel = ActorWeightChannel(
        control,
        timeout_s=cfg.learner.weight_sync_timeout_s,
        log=say,
        wire_dtype=_DTYPES[cfg.model.dtype],
        stop=stop,
        network=cfg.network,
        transport=name,
        workers_per_actor=cfg.actor.tensor_parallel_size,
        device=device,
        defer_ack=cfg.learner.defer_weight_ack,
    )
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
