"""``ActorWeightChannel.open``: an actor that does not join the first group in time (stopped,
cut off, dead since it registered) does not end the learner. Found by the chaos run
(tests/faults/chaos, seed 13 with 120 s of faults): a learner restarted while an actor was
SIGSTOPped failed its start with ``gloo weight group rendezvous failed ... 2/3 clients
joined`` and used up ``learner.restart_max``. Now the failure is counted and logged, and the
first sync re-forms the group with the actors that answer a ping."""

from __future__ import annotations

import time

from asyncrl.core.weights.base import SendStats
from asyncrl.learner.weights.channel import ActorWeightChannel, ChannelOptions, WeightSyncError


class _Control:
    """Two registered actors; actor 1 answers pings, actor 0 stays silent."""

    actors = {0: None, 1: None}

    def __init__(self) -> None:
        self.sent: list = []
        self._inbox: list[dict] = []

    def send(self, actor_id, msg) -> None:
        self.sent.append((actor_id, msg["type"]))

    def broadcast(self, msg) -> None:
        self.sent.append(("all", msg["type"]))
        if msg["type"] == "ping":
            self._inbox.append({"type": "pong", "nonce": msg["nonce"], "actor_id": 1})

    def recv(self, timeout_s):
        if self._inbox:
            return self._inbox.pop(0)
        time.sleep(min(timeout_s, 0.01))
        return None


class _Sender:
    """Its first ``connect`` times out (a member never joins); later ones succeed."""

    name, defers_ack, timeout_s = "fake", False, 5.0

    def __init__(self) -> None:
        self.connects, self.closed, self.sent = 0, 0, []
        self.worlds: list[int] = []

    def open(self, world_size, network) -> dict:
        self.worlds.append(world_size)
        return {"transport": "fake"}

    def connect(self) -> None:
        self.connects += 1
        if self.connects == 1:
            raise WeightSyncError("gloo weight group rendezvous failed: 2/3 clients joined")

    def send(self, named, version, wait_ack=True):
        self.sent.append(version)
        return SendStats(bytes=4, tensors=1, seconds=0.0)

    def close(self) -> None:
        self.closed += 1


def test_a_first_group_that_cannot_form_is_formed_again_at_the_first_sync():
    control, sender, said = _Control(), _Sender(), []
    options = ChannelOptions(ping_s=0.5)
    channel = ActorWeightChannel(control, options, log=said.append, sender=sender)
    assert channel.open() is channel  # no WeightSyncError: the learner goes on
    assert channel.failures == 1 and channel.rebuilds == 0 and sender.closed >= 1
    assert said == ["weight sync: the first group could not be formed (gloo weight group "
                    "rendezvous failed: 2/3 clients joined); the first sync forms it with the "
                    "actors that answer"]  # fmt: skip
    assert channel.rejoin_pending()  # the learner syncs before it waits for data
    assert channel.attempt([], 7, 0) is False
    assert ("all", "ping") in control.sent and channel.members == [1]
    assert sender.worlds == [3, 2] and sender.sent == [7] and channel.rebuilds == 1
    assert (
        said[-1] == "weight sync: new group with actors [1] (the first group could not be formed)"
    )
