"""A weight sync that fails while the learner is stopping is not retried (the actors are being
stopped too): before, the retries' liveness rounds and rendezvous outlasted the launcher's
grace period and the learner was SIGKILLed mid-stop."""

from __future__ import annotations

import time

from asyncrl.learner.weights.channel import ActorWeightChannel, ChannelOptions, WeightSyncError


class _Control:
    actors = {0: None}

    def __init__(self) -> None:
        self.sent: list = []

    def send(self, actor_id, msg) -> None:
        self.sent.append((actor_id, msg["type"]))

    def recv(self, timeout_s):
        time.sleep(timeout_s)
        return None

    def broadcast(self, msg) -> None:
        self.sent.append(("all", msg["type"]))


class _DeadPeer:
    def send(self, named, version):
        raise WeightSyncError("Connection closed by peer")

    def close(self) -> None:
        pass


def _channel(stop) -> tuple[ActorWeightChannel, _Control, list[str]]:
    control, said = _Control(), []
    channel = ActorWeightChannel(control, ChannelOptions(timeout_s=5.0), log=said.append, stop=stop)
    channel.sender, channel.members, channel._dirty = _DeadPeer(), [0], False
    return channel, control, said


def test_a_failed_sync_while_stopping_is_not_retried():
    channel, control, said = _channel(stop=lambda: True)
    t0 = time.monotonic()
    stats = channel.sync([], version=3)
    assert time.monotonic() - t0 < 1.0
    assert stats.bytes == 0 and channel.failures == 1
    assert ("all", "ping") not in control.sent  # no liveness round, no rebuild
    assert said == ["weight sync 3 failed while stopping (Connection closed by peer); not retried"]


def test_a_stop_ends_a_liveness_round_at_once():
    stopping = {"now": False}
    channel, control, _ = _channel(stop=lambda: stopping["now"])
    channel.ping_s = 30.0
    stopping["now"] = True
    t0 = time.monotonic()
    assert channel._ping() == []
    assert time.monotonic() - t0 < 1.0
