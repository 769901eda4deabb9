"""Learner rank 0's weight channel to the actors: membership, regrouping and retries.

``ActorWeightChannel`` owns one transport ``Sender`` (asyncrl/core/weights/: ``gloo`` or
``nccl``) and the control plane. It decides who is in the weight group, tells each member
where to join (``weights_init``), announces each version (``update``) and re-forms the group
when a receiver dies. The transport moves the bytes; nothing here depends on which one.
The learner never goes through vLLM's trainer-side weight-transfer API: only the receiving
end is registered in vLLM (asyncrl/actors/weights/plugin.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from asyncrl.core.config.network import NetworkConfig
from asyncrl.core.weights import transports
from asyncrl.core.weights.base import SendStats
from asyncrl.core.weights.stream import DEFAULT_TIMEOUT_S, WeightSyncError

if TYPE_CHECKING:
    from asyncrl.core.weights.base import Sender

__all__ = ["ActorWeightChannel", "ChannelOptions", "SendStats", "WeightSyncError"]


@dataclass(frozen=True)
class ChannelOptions:
    """What an ``ActorWeightChannel`` sends over and how long it waits; the learner fills it
    from ``learner.*`` (``asyncrl.learner.weights.publisher.open_weight_channel``)."""

    transport: str = "gloo"
    """A name in ``asyncrl.core.weights.transports.TRANSPORTS``."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Deadline of each rendezvous and each collective (seconds)."""
    ping_s: float | None = None
    """Deadline of a liveness round (seconds); None = ``timeout_s + 5``."""
    max_attempts: int = 3
    """Tries of one version before ``WeightSyncError``."""
    bucket_bytes: int | None = None
    """The transport's bucket size; None = the transport's default."""
    wire_dtype: torch.dtype | None = None
    """The dtype the tensors travel in (the actors'); None = as given."""
    network: NetworkConfig | None = None
    """Where the group binds and what the actors are told (its ``address``); None = loopback."""
    workers_per_actor: int = 1
    """Receiver ranks per actor, one per vLLM worker (e.g. tensor parallel); >= 1."""
    device: torch.device | None = None
    """The learner's device (nccl sends from it)."""
    defer_ack: bool = False
    """A try returns once every byte is sent, and the receivers' ack is collected in a thread
    (``settle``), where the transport can (``defers_ack``: gloo, shm); otherwise each try
    waits for it."""

    def __post_init__(self) -> None:
        if self.workers_per_actor < 1:
            raise ValueError(f"workers_per_actor must be >= 1, got {self.workers_per_actor}")

    def build_sender(self) -> Sender:
        """A new transport sender with these options."""
        sizes = {} if self.bucket_bytes is None else {"bucket_bytes": self.bucket_bytes}
        return transports.sender(
            self.transport,
            timeout_s=self.timeout_s,
            wire_dtype=self.wire_dtype,
            device=self.device,
            **sizes,
        )


class ActorWeightChannel:
    """Learner rank 0's weight channel to the actors: the control plane + a transport
    ``Sender`` whose group is re-formed when a receiver dies (docs/reliability.md, guarantee 8).

    One try of ``attempt(named, version, n)`` (``sync`` loops over tries for callers in one
    process):

    1. drains the control plane: an actor that (re-)registered (a restarted actor) or that
       is alive but outside the group is scheduled to join;
    2. re-forms the group if its membership must change: a new group from the transport
       (``open``), ranks ``1..`` for the members in actor-id order (``workers_per_actor``
       ranks each: one per vLLM worker, e.g. tensor parallel), ``weights_init`` to each
       member (every group after the first is logged, ``weight sync: new group with actors
       [...]``);
    3. sends ``{"type": "update", "version"}`` to the members and streams the weights. If that
       fails (``WeightSyncError``: a receiver died mid-transfer, a deadline passed, a receiver
       rejected the sync), it closes the group and asks for another try; that try asks every
       registered actor ``ping`` and re-forms the group with those that answer ``pong``
       within ``ping_s`` (default ``timeout_s + 5``: a survivor may be stuck in the failed
       collective until its deadline; the round ends as soon as every registered actor
       answered), then sends the same version again in full, so every survivor ends with
       identical weights. After ``max_attempts`` failed tries it raises ``WeightSyncError``
       naming what failed.

    Every wait is bounded: ``timeout_s`` per rendezvous and per collective, ``ping_s`` per
    liveness round. A restarted actor gets the current weights in the first sync after it
    registers (a full send). Actors must answer ``ping`` with ``{"type": "pong", "nonce"}``
    and, when a receive fails, stay alive and wait for the next ``weights_init``; an actor
    that instead exits is simply left out until it registers again.
    """

    def __init__(
        self,
        control,
        options: ChannelOptions | None = None,
        *,
        log: Callable[[str], None] = print,
        stop: Callable[[], bool] = lambda: False,
        sender: Sender | None = None,
    ) -> None:
        """``options``: the transport and the bounds (``ChannelOptions``; None = its defaults).
        ``log``: where the channel's lines go; ``stop``: see ``self.stop``; ``sender``: a
        ready sender (tests), instead of one built from ``options``."""
        options = options or ChannelOptions()
        self.options = options
        self.control = control
        self.network = options.network or NetworkConfig()
        self.stop = stop
        """True once the learner is asked to stop: a failed sync is then not retried and a
        liveness round ends at once (the actors are being stopped too)."""
        self.sender: Sender = sender or options.build_sender()
        self.workers_per_actor = options.workers_per_actor
        # a survivor may sit in the failed collective until its own deadline before it can
        # answer, so the liveness round outlasts the collective deadline
        timeout_s = options.timeout_s
        self.ping_s = timeout_s + 5.0 if options.ping_s is None else options.ping_s
        self.timeout_s, self.max_attempts = timeout_s, options.max_attempts
        self.log = log
        self.members: list[int] = []
        self.failures = 0
        """Tries that failed (each retried with a re-formed group, up to ``max_attempts``)."""
        self.rebuilds = 0
        """Groups formed, including the first."""
        self.last_stats = SendStats(bytes=0, tensors=0, seconds=0.0)
        """What the last successful try sent (zeros when it had no live actor)."""
        self._dirty = True
        self.defer_ack = options.defer_ack and getattr(self.sender, "defers_ack", False)
        self._ack: PendingAck | None = None
        self._regroup = False  # a deferred ack failed: re-form the group with a ping round
        self._regroup_why = "after its ack failed or was abandoned"

    @property
    def transport(self) -> str:
        return self.sender.name

    def open(self) -> ActorWeightChannel:
        """Form the first group with every registered actor; returns self. An actor that does
        not join in time (stopped, cut off, dead since it registered) does not end the
        learner: the failure is counted and logged, and the first sync re-forms the group
        with the actors that answer a ping, as after a failed sync (the chaos run found a
        learner restarted next to a stalled actor failing here, using up its restarts)."""
        try:
            self._rebuild(sorted(self.control.actors), reason=None)
        except WeightSyncError as e:
            self.failures += 1
            self.sender.close()
            self._regroup, self._regroup_why = True, "the first group could not be formed"
            self.log(
                f"weight sync: the first group could not be formed ({e}); the first sync "
                "forms it with the actors that answer"
            )
        return self

    def sync(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> SendStats:
        """Every try of sending ``named`` (re-iterated for each) as ``version``; for callers
        in one process. A learner over several ranks calls ``attempt`` instead."""
        named = list(named)
        attempt = 0
        while self.attempt(named, version, attempt):
            attempt += 1
        return self.last_stats

    def attempt(
        self, named: Iterable[tuple[str, torch.Tensor]], version: int, attempt: int
    ) -> bool:
        """Try ``attempt`` (0, 1, ...) of sending ``named`` as ``version`` to every live actor.

        Returns True when this try failed and another should follow: the caller produces
        the tensors again (every rank of a learner gathers them again, learner/trainer.py).
        False when done: sent, no live actor, or a failure while stopping. Raises
        ``WeightSyncError`` once ``max_attempts`` tries failed. ``named`` is always consumed
        to its end, also after a failure: the other ranks are still gathering it.
        """
        it = iter(named)
        try:
            self.last_stats = SendStats(bytes=0, tensors=0, seconds=0.0)
            if attempt == 0:
                self.settle()  # the last sync's deferred ack
                self._drain()
                if self._regroup:
                    self._regroup = False
                    self._rebuild(self._ping(), self._regroup_why)
                elif self._dirty:
                    self._rebuild(self._candidates(), "an actor registered or was outside it")
            else:
                self._rebuild(self._ping(), "after the failure above")
            if not self.members:
                return False
            for actor_id in self.members:
                self.control.send(actor_id, {"type": "update", "version": version})
            if self.defer_ack:
                self.last_stats = self.sender.send(it, version, wait_ack=False)
                self._ack = PendingAck(self.sender, version)
            else:
                self.last_stats = self.sender.send(it, version)
            return False
        except WeightSyncError as e:
            return self._failed(e, version, attempt)
        finally:
            for _ in it:  # keep every rank in the gather's collectives
                pass

    def _failed(self, error: WeightSyncError, version: int, attempt: int) -> bool:
        """Count and log a failed try; True if another try should follow."""
        self.failures += 1
        self.sender.close()
        if self.stop():
            self.log(f"weight sync {version} failed while stopping ({error}); not retried")
            return False
        if attempt + 1 >= self.max_attempts:
            raise WeightSyncError(
                f"weight sync {version} failed {self.max_attempts} times, last: {error}. "
                "Check the actor logs; an actor that cannot receive weights must be restarted"
            ) from error
        self.log(
            f"weight sync {version} failed (attempt {attempt + 1}/{self.max_attempts}, "
            f"members {self.members}): {error}; rebuilding the group with the actors "
            "that answer"
        )
        return True

    def settle(self) -> None:
        """Wait for the deferred ack of the last sync, if one is pending (bounded by the
        group's deadline; abandoned once the learner is stopping). A failed ack is counted in
        ``failures`` and logged; then, as after an abandoned one, the group is closed and the
        next try re-forms it with the actors that answer and sends its version in full."""
        pending, self._ack = self._ack, None
        if pending is None:
            return
        done, error = pending.wait(self.stop)
        if done and error is None:
            return
        self.sender.close()  # the ack's thread may still be in a collective on it
        self._regroup, self._regroup_why = True, "after its ack failed or was abandoned"
        if error is not None:
            self.failures += 1
            self.log(
                f"weight sync {pending.version} failed at its ack ({error}); the next "
                "sync rebuilds the group with the actors that answer"
            )

    def rejoin_pending(self) -> bool:
        """Read the control plane now; True if the next sync will rebuild the group (an
        actor registered again, or a live actor is outside the group)."""
        self._drain()
        return self._dirty

    def _candidates(self) -> list[int]:
        """Members for a rebuild that no failure forced: every registered actor."""
        return sorted(self.control.actors)

    def _drain(self) -> None:
        """Read pending control messages; a (re-)registration or a live non-member means the
        group must be rebuilt before the next send."""
        while (msg := self.control.recv(0)) is not None:
            self._note(msg)

    def _note(self, msg: dict) -> None:
        actor_id = msg.get("actor_id")
        if msg["type"] == "register" or (actor_id is not None and actor_id not in self.members):
            self._dirty = True

    def _ping(self) -> list[int]:
        """Actors that answer a ping within ``ping_s`` (every registered one is asked)."""
        import secrets

        nonce = secrets.token_hex(4)
        self.control.broadcast({"type": "ping", "nonce": nonce})
        alive: set[int] = set()
        deadline = time.monotonic() + self.ping_s
        while time.monotonic() < deadline and len(alive) < len(self.control.actors):
            if self.stop():
                break
            msg = self.control.recv(0.05)
            if msg is None:
                continue
            self._note(msg)
            # a (re-)registration is a live actor too: a restarted one never saw this ping
            if msg["type"] == "register" or (msg["type"] == "pong" and msg.get("nonce") == nonce):
                alive.add(int(msg["actor_id"]))
        return sorted(alive)

    def _rebuild(self, actor_ids: list[int], reason: str | None) -> None:
        """A new group (from the transport's ``open``) whose receivers are ``actor_ids``.
        Once it is formed it is counted in ``rebuilds`` and, unless ``reason`` is None (the
        first group), logged with it: the log lines and the count agree."""
        self.sender.close()
        self.members, self._dirty = list(actor_ids), False
        if not self.members:
            self.log("weight sync: no live actor; the next sync retries when one registers")
            return
        k = self.workers_per_actor
        info = self.sender.open(1 + k * len(self.members), self.network)
        for i, actor_id in enumerate(self.members):
            self.control.send(actor_id, {"type": "weights_init", **info, "rank_offset": 1 + k * i})
        self._dirty = True  # until connect succeeds
        self.sender.connect()
        self._dirty = False
        self.rebuilds += 1
        if reason is not None:
            self.log(f"weight sync: new group with actors {self.members} ({reason})")

    def close(self) -> None:
        """Close the group; a deferred ack still pending is not waited for."""
        self._ack = None
        self.sender.close()


class PendingAck:
    """The receivers' ack of version ``version``, collected by a daemon thread
    (``sender.collect_ack``) while the learner trains its next step."""

    def __init__(self, sender: Sender, version: int) -> None:
        self.version = version
        self._error: Exception | None = None
        self._thread = threading.Thread(
            target=self._run, args=(sender,), daemon=True, name=f"weight-ack-{version}"
        )
        self._thread.start()

    def _run(self, sender) -> None:
        try:
            sender.collect_ack(self.version)
        except Exception as e:  # WeightSyncError, or a collective's own error
            self._error = e

    def wait(self, stop: Callable[[], bool]) -> tuple[bool, Exception | None]:
        """``(done, error)``: ``(True, None)`` once every receiver loaded the version,
        ``(True, error)`` if the ack failed, ``(False, None)`` as soon as ``stop()`` turns
        True while it is still waiting (abandoned)."""
        while self._thread.is_alive():
            if stop():
                return False, None
            self._thread.join(0.05)
        return True, self._error
