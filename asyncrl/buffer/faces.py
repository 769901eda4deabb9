"""Two faces on the buffer: what an actor asks of it, and what the learner asks of it.

``ReplayBuffer`` (buffer/redis_buffer.py) is one object with both sides and more (``stats``
for ``asyncrl status``, ``renew``, ``dead_letters``); a role sees only its face::

    BufferHandle   name, client, call, retrying: what the buffer's own helpers beside it
                   (cursors.py, eval_queue.py) and the roles' endpoint records use
    ActorBuffer    + lease, lease_many, commit, release; learner_version; meta, set_meta,
                   claim_meta                                        (asyncrl/actors/)
    LearnerBuffer  + read, read_pending, set_deliveries, ack, max_deliveries; audit, stats,
                   repairs; learner_version and its setters; meta, set_meta
                                                                     (asyncrl/learner/)

``ReplayBuffer`` satisfies both structurally (tests/unit/conformance.py checks it under mypy),
and a test fake need only implement the face its role uses. The semantics and invariants of
each method are ``ReplayBuffer``'s docstrings; one line each here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    import redis

    from asyncrl.buffer.staleness import Window
    from asyncrl.buffer.stream_reads import Entry
    from asyncrl.core.types import Group

T = TypeVar("T")


class BufferHandle(Protocol):
    """The buffer's name, its Redis connection and its retry policy."""

    @property
    def name(self) -> str:
        """The buffer's name: its stream's key, the prefix of every other key of the job."""
        ...

    @property
    def client(self) -> redis.Redis:
        """The Redis connection (bytes replies)."""
        ...

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` (a Redis call on ``client``) retried while the connection is down."""
        ...

    def retrying(
        self,
        fn: Callable[[], T],
        keys: list[str],
        on_retry: Callable[..., Any] | None = None,
        consumer: str = "",
    ) -> T:
        """``call``, and a reply that says ``keys`` are damaged raises ``BufferDamaged``."""
        ...


class ActorBuffer(BufferHandle, Protocol):
    """What an actor asks of the buffer: slots, commits, and the run's meta."""

    def lease(self, actor_id: int, timeout_s: float) -> str | None:
        """Reserve one slot, waiting up to ``timeout_s`` while the buffer is full."""
        ...

    def lease_many(
        self,
        actor_id: int,
        count: int,
        timeout_s: float,
        window: Callable[[], Window] | None = None,
    ) -> list[str]:
        """Reserve up to ``count`` slots in one round trip ([] when none freed in time)."""
        ...

    def commit(self, lease_id: str, group: Group, in_flight: tuple[str, int] | None = None) -> bool:
        """Store ``group`` in the slot of ``lease_id``; False if it was committed before."""
        ...

    def release(self, lease_id: str) -> bool:
        """Give a slot back without committing; False if the lease was already gone."""
        ...

    def learner_version(self) -> int:
        """The learner's published policy version, -1 before the first publish."""
        ...

    def meta(self) -> dict[str, str]:
        """All meta fields, as strings."""
        ...

    def set_meta(self, **kv: str | int | float) -> None:
        """Publish run-wide fields (stored as strings)."""
        ...

    def claim_meta(self, key: str, value: str) -> str | None:
        """Set meta ``key`` unless set: None when this call set it, else the value before."""
        ...


class LearnerBuffer(BufferHandle, Protocol):
    """What the learner (rank 0's hub and its parts) asks of the buffer: reads, acks, the
    ledger, and the versions and meta it publishes."""

    def read(
        self, consumer: str, count: int, block_ms: int, vocab_size: int | None = None
    ) -> list[Entry]:
        """Up to ``count`` new valid groups, waiting up to ``block_ms``."""
        ...

    def read_pending(self, consumer: str, vocab_size: int | None = None) -> list[Entry]:
        """What ``consumer`` was handed and did not ack (after a restart)."""
        ...

    def set_deliveries(self, consumer: str, counts: dict[str, int]) -> None:
        """Set pending entries' delivery counts (steps started with them, not completed)."""
        ...

    def ack(self, entry_ids: Iterable[str], state: str) -> int:
        """Remove entries, counted as terminal ``state``; returns how many were pending."""
        ...

    @property
    def max_deliveries(self) -> int:
        """Deliveries without a completed step after which an entry is dead-lettered."""
        ...

    def audit(self) -> dict[str, int]:
        """``stats()`` plus the conservation law's check, one round trip."""
        ...

    def stats(self) -> dict[str, int]:
        """One atomic snapshot of the counters (Prometheus reads it at scrape time)."""
        ...

    @property
    def repairs(self) -> list[str]:
        """One line per repair of damage from outside (a rebuilt consumer group)."""
        ...

    def learner_version(self) -> int:
        """The learner's published policy version, -1 before the first publish."""
        ...

    def set_learner_version(self, version: int) -> None:
        """Publish the learner's policy version."""
        ...

    def set_learner_last_version(self, version: int) -> None:
        """Publish the version the learner's last step reads at."""
        ...

    def set_learner_wants(self, wants: int) -> None:
        """Publish how many groups the step being read still needs (``admission=window``)."""
        ...

    def meta(self) -> dict[str, str]:
        """All meta fields, as strings."""
        ...

    def set_meta(self, **kv: str | int | float) -> None:
        """Publish run-wide fields (stored as strings)."""
        ...
