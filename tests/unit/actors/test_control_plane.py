"""``asyncrl.actors.control_plane.ControlPlane`` on a scripted client and engine: each learner
message gets its answer, a weight load is bracketed by the pause and counted, a failed
receive keeps the actor up, and ``stop`` ends the loop."""

from __future__ import annotations

import asyncio

from asyncrl.actors.actor import ActorState
from asyncrl.actors.control_plane import ControlPlane
from asyncrl.core.config.load import load_config
from asyncrl.core.observe.metrics import ACTOR_STATES, ActorMetrics, StateClock
from tests.fakes.engines import ScriptedEngine


class ScriptedClient:
    """Hands out ``messages`` one per ``recv``, then None; records what the actor sends."""

    def __init__(self, messages: list[dict]) -> None:
        self.messages, self.sent, self.endpoint = list(messages), [], None

    async def send(self, msg: dict) -> None:
        self.sent.append(msg)

    async def recv(self, timeout: float):
        await asyncio.sleep(0)
        return self.messages.pop(0) if self.messages else None


def _run(messages, engine):
    cfg = load_config(["metrics_port=0"])
    state, pauses = ActorState(actor_id=0), []
    metrics = ActorMetrics({"buffer_name": "t", "actor_id": 0}, StateClock(ACTOR_STATES, "idle"))
    changed = asyncio.Event()
    plane = ControlPlane(cfg, engine, None, state, metrics, pauses.append, changed)
    client = ScriptedClient(messages)
    asyncio.run(asyncio.wait_for(plane.run(client), 10))
    return state, client, pauses, changed


def test_each_message_gets_its_answer_and_stop_ends_the_loop():
    engine = ScriptedEngine(syncs=True)
    msgs = [{"type": "weights_init", "rank": 1}, {"type": "ping", "nonce": "n1"},
            {"type": "update", "version": 3}, {"type": "stop"}]  # fmt: skip
    state, client, pauses, changed = _run(msgs, engine)
    assert client.sent == [{"type": "register"}, {"type": "pong", "nonce": "n1"},
                           {"type": "updated", "version": 3}]  # fmt: skip
    assert engine.joined[0]["rank"] == 1 and "local_address" in engine.joined[0]
    assert engine.loaded == [(3, load_config().actor.update_mode)]
    assert state.version == 3 and state.weight_syncs == 1 and pauses == [True, False]
    assert state.stop and changed.is_set()


def test_a_failed_receive_is_counted_and_the_actor_serves_on():
    engine = ScriptedEngine(syncs=True, fail_version=2)
    msgs = [{"type": "update", "version": 2}, {"type": "update", "version": 4}, {"type": "stop"}]
    state, client, pauses, _ = _run(msgs, engine)
    assert state.weight_sync_failures == 1 and state.version == 4
    assert client.sent[-1] == {"type": "updated", "version": 4}
    assert pauses == [True, False, True, False]  # the failed load resumed the engine too
