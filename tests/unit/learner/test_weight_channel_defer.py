"""``ActorWeightChannel(defer_ack=True)``: a try returns once its bytes are sent; the ack is
collected in a thread and settled before the next sync (or a validation), a failed ack
re-forms the group with the actors that answer a ping, and a stop abandons a pending ack."""

from __future__ import annotations

import threading
import time

from asyncrl.core.weights.base import SendStats
from asyncrl.learner.weights.channel import ActorWeightChannel, ChannelOptions, WeightSyncError


class _Control:
    actors = {0: None, 1: None}

    def __init__(self) -> None:
        self.sent: list = []

    def send(self, actor_id, msg) -> None:
        self.sent.append((actor_id, msg["type"]))

    def recv(self, timeout_s):
        time.sleep(min(timeout_s, 0.01))
        return None

    def broadcast(self, msg) -> None:
        self.sent.append(("all", msg["type"]))


class _Sender:
    """Records sends; ``collect_ack`` waits for ``release`` and then fails if ``reject``."""

    name, defers_ack, timeout_s = "fake", True, 5.0

    def __init__(self) -> None:
        self.sent: list[tuple[int, bool]] = []
        self.release, self.reject, self.closed = threading.Event(), False, 0

    def send(self, named, version, wait_ack=True):
        self.sent.append((version, wait_ack))
        return SendStats(bytes=4, tensors=1, seconds=0.0)

    def collect_ack(self, version) -> None:
        assert self.release.wait(10.0)
        if self.reject:
            raise WeightSyncError(f"a receiver rejected weight sync version {version}")

    def open(self, world_size, network) -> dict:
        return {"transport": "fake"}

    def connect(self) -> None:
        pass

    def close(self) -> None:
        self.closed += 1


def _channel(stop=lambda: False):
    control, sender, said = _Control(), _Sender(), []
    options = ChannelOptions(defer_ack=True, ping_s=0.2)
    channel = ActorWeightChannel(control, options, log=said.append, stop=stop, sender=sender)
    channel.members, channel._dirty = [0, 1], False
    return channel, control, sender, said


def test_a_sync_returns_before_the_ack_and_the_next_one_settles_it_first():
    channel, _, sender, said = _channel()
    t0 = time.monotonic()
    assert channel.attempt([], 1, 0) is False and time.monotonic() - t0 < 1.0
    assert sender.sent == [(1, False)] and channel._ack is not None  # the ack is pending
    threading.Timer(0.3, sender.release.set).start()
    t0 = time.monotonic()
    assert channel.attempt([], 2, 0) is False
    assert time.monotonic() - t0 >= 0.25  # it waited for version 1's ack before sending 2
    assert sender.sent == [(1, False), (2, False)] and channel.failures == 0 and not said


def test_a_failed_ack_is_counted_and_the_next_sync_regroups_with_a_ping():
    channel, control, sender, said = _channel()
    channel.attempt([], 1, 0)
    sender.reject = True
    sender.release.set()
    channel.settle()
    assert channel.failures == 1 and sender.closed == 1
    assert said == ["weight sync 1 failed at its ack (a receiver rejected weight sync version "
                    "1); the next sync rebuilds the group with the actors that answer"]  # fmt: skip
    sender.reject = False
    assert channel.attempt([], 2, 0) is False
    assert ("all", "ping") in control.sent and channel.members == []  # nobody answered
    assert sender.sent == [(1, False)]  # no live actor: version 2 is not sent


def test_a_stop_abandons_a_pending_ack_at_once():
    stopping = {"now": False}
    channel, _, sender, _ = _channel(stop=lambda: stopping["now"])
    channel.attempt([], 1, 0)
    stopping["now"] = True
    t0 = time.monotonic()
    channel.settle()
    assert time.monotonic() - t0 < 0.5 and channel.failures == 0
    assert sender.closed == 1 and channel._regroup  # its thread may still use the group
    sender.release.set()


def test_without_the_transport_capability_each_sync_waits_for_its_ack():
    control, sender = _Control(), _Sender()
    sender.defers_ack = False
    channel = ActorWeightChannel(control, ChannelOptions(defer_ack=True), sender=sender)
    channel.members, channel._dirty = [0], False
    channel.attempt([], 1, 0)
    assert not channel.defer_ack and sender.sent == [(1, True)] and channel._ack is None
