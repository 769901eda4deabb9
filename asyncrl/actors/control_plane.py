"""An actor's side of the control plane: register with the learner, follow it when it moves
(a restarted learner), and load the weights it sends.

    weights_init  join the weight collective (the engine's receiver)
    update v      pause the engine, receive version v, resume; answer ``updated``
    ping          answer ``pong`` (the learner's liveness check before a regroup)
    stop          end the actor

A failed join or receive does not end the actor: the engine marks its weights invalid
(generation waits), the learner pings every actor, rebuilds the weight group with those that
answer ``pong`` and sends the weights again in full (learner/weight_sender
``ActorWeightChannel``). A restarted actor rejoins the same way: it registers, the learner
rebuilds the group with it and sends it the current weights in full.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from asyncrl.actors.engine.protocol import Engine
from asyncrl.core.config.job import Config
from asyncrl.core.runtime.faults import failpoint

if TYPE_CHECKING:
    from asyncrl.buffer.faces import ActorBuffer
    from asyncrl.core.net.control import ControlClient

LEARNER_QUIET_S = 5.0
"""No learner message for this long: re-read its address from the buffer meta."""


class ControlPlane:
    """Serves the learner's messages for one actor. ``state`` is the actor's ``ActorState``
    (``version``, ``stop`` and the sync counters change here); ``paused(True/False)`` brackets
    each weight load; ``version_changed`` is set after each load and at the end; ``metrics``
    the actor's ``ActorMetrics``."""

    def __init__(
        self,
        cfg: Config,
        engine: Engine,
        buffer: ActorBuffer,
        state,
        metrics,
        paused: Callable[[bool], None],
        version_changed: asyncio.Event,
    ) -> None:
        self.cfg, self.engine, self.buffer = cfg, engine, buffer
        self.state, self.metrics, self.paused = state, metrics, paused
        self.version_changed = version_changed

    def _say(self, text: str) -> None:
        print(f"[actor {self.state.actor_id}] {text}", flush=True)

    async def run(self, client: ControlClient) -> None:
        """Register, then serve messages until ``stop`` (module docstring)."""
        from asyncrl.core.weights.stream import WeightSyncError

        await client.send({"type": "register"})
        heard = time.monotonic()
        while not self.state.stop:
            msg = await client.recv(0.5)
            if msg is None:
                if time.monotonic() - heard > LEARNER_QUIET_S:
                    heard = time.monotonic()
                    await self._follow_learner(client)
                continue
            heard = time.monotonic()
            try:
                await self._on_message(client, msg)
            except WeightSyncError as e:
                self.state.weight_sync_failures += 1
                self._say(f"{e}; waiting for the learner to rebuild the weight group")
        self.version_changed.set()

    async def _follow_learner(self, client: ControlClient) -> None:
        """After a quiet spell, re-read the learner's address from the buffer meta: a learner
        that restarted (or a run dir reused, whose meta held the previous learner's address
        until the new one published its own) listens elsewhere. Re-register there; it sends
        ``weights_init`` and the current weights as to any newly registered actor."""
        from asyncrl.core.net.control import Endpoint

        endpoint = Endpoint.from_meta(await asyncio.to_thread(self.buffer.meta))
        if endpoint and endpoint != client.endpoint:
            self._say(
                f"the learner's control plane moved to {endpoint.address} (a restarted "
                "learner); registering there"
            )
            client.connect(endpoint)
            await client.send({"type": "register"})

    async def _on_message(self, client: ControlClient, msg: dict) -> None:
        kind = msg["type"]
        if kind == "weights_init":
            info = {k: v for k, v in msg.items() if k != "type"}
            # gloo binds this host's own address (the learner's is master_address)
            await self.engine.join_weight_sync(
                {**info, "local_address": self.cfg.network.interface}
            )
        elif kind == "update":
            await self.update_weights(int(msg["version"]))
            self.version_changed.set()
            await client.send({"type": "updated", "version": self.state.version})
        elif kind == "ping":
            await client.send({"type": "pong", "nonce": msg.get("nonce")})
        elif kind == "stop":
            self.state.stop = True

    async def update_weights(self, version: int) -> None:
        """Load ``version`` into the engine (``actor.update_mode`` says what happens to the
        requests in flight), counted in the state and the metrics."""
        failpoint("actor.before_weight_receive", version=version)  # a slow or frozen actor
        t0 = time.monotonic()
        self.paused(True)
        try:
            await self.engine.update_weights(version, self.cfg.actor.update_mode)
        finally:
            self.paused(False)
        seconds = time.monotonic() - t0
        self.state.version = version
        self.state.weight_syncs += 1
        self.state.weight_sync_s += seconds
        self.metrics.version.set(version)
        self.metrics.sync_seconds.observe(seconds)
