"""Replay buffer on Redis Streams: one stream entry = one complete group (Arrow IPC payload).

::

    actor:   lease() --slot--> generate --> commit(lease, group) --XADD--> [ stream N ]
                (blocks while leased + unread == capacity)                     |
    learner: read(consumer) <--XREADGROUP-- unread ---> pending ---ack()---> trained |
                 |  invalid payload or forged entry: dead-letter to N:dead       dropped_stale |
                 |  (dropped_invalid)                                          dropped_uniform
                 '-- read_pending(consumer) after a restart re-reads pending; an entry
                     delivered max_deliveries times without a completed step is
                     dead-lettered to N:dead (dropped_poison)

Every multi-key change is one Lua script (``buffer/scripts.py``), so no reader ever sees a
half-applied state and ``stats()`` is a consistent snapshot.

Damage from outside the job (tests/faults/test_buffer_damage.py): a
consumer group destroyed by hand is rebuilt exactly where it was (``BufferStore.regroup``, a warning);
an entry that commit() did not add, or whose seq is not the one commit() gave it, is
dead-lettered as invalid and counted; state that is missing or not a number (a FLUSHDB, a
hand edit) raises ``BufferDamaged`` naming the key and the fix. ``audit()`` is the learner's
per-step check of the conservation law.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import redis

from asyncrl.buffer import scripts
from asyncrl.buffer.codec import DEFAULT_MAX_BYTES, encode_group
from asyncrl.buffer.staleness import Window
from asyncrl.buffer.store import BufferDamaged, BufferStore, as_text
from asyncrl.buffer.stream_reads import Entry, StreamReads
from asyncrl.core.types import Group

log = logging.getLogger(__name__)

WAKE_POLL_S = 0.5
"""Longest an actor blocks in ``lease`` without retrying: slots freed by a read or a release
wake it at once (a token on ``<name>:wake``); one freed by a lease's expiry is seen within this."""
WINDOW_POLL_S = 0.05
"""Longest a lease waiting for the admission window blocks before it tries again with the
actor's weights version of that moment (``lease_many``'s ``window``)."""
_NO_WINDOW = Window(weights_version=0, max_staleness=-1, batch_groups=1)
"""LEASE's arguments for ``buffer.admission=capacity``: max_staleness -1 = no window."""
TERMINAL_STATES = (
    "trained",
    "dropped_stale",
    "dropped_invalid",
    "dropped_poison",
    "dropped_uniform",
)
"""Every state a committed group ends in (one counter each in ``N:stats``)."""
_RESERVED_META = (
    "capacity",
    "consumer_group",
    "learner_version",
    "learner_wants",
    "learner_wants_from",
    "learner_last_version",
    "delivered_upto",
    "delivered_to",
)
__all__ = ["TERMINAL_STATES", "BufferDamaged", "Entry", "LeaseExpired", "ReplayBuffer"]


class LeaseExpired(RuntimeError):
    """A commit came after its lease expired and the buffer had no free slot: not stored."""


@dataclass(frozen=True)
class BufferOptions:
    """How one process uses the buffer, past its name and capacity (config: ``buffer.*``)."""

    lease_ttl_s: float = 60.0
    """A leased slot not committed within this is freed (its actor presumed dead)."""
    consumer_group: str = "learner"
    """The Redis Streams consumer group the learner reads with."""
    max_payload_bytes: int = DEFAULT_MAX_BYTES
    """A group larger than this is refused at commit and dead-lettered at read."""
    reconnect_s: float = 5.0
    """How long a call retries a lost Redis before it fails (``BufferUnavailable``)."""
    max_deliveries: int = 3
    """A payload delivered this often without an ack is poison: dead-lettered, counted."""

    def __post_init__(self) -> None:
        if self.lease_ttl_s <= 0:
            raise ValueError(f"lease_ttl_s must be > 0, got {self.lease_ttl_s}")
        if self.max_deliveries < 1:
            raise ValueError(f"max_deliveries must be >= 1, got {self.max_deliveries}")
        if not self.consumer_group:
            raise ValueError("name and consumer_group must be non-empty")


class ReplayBuffer:
    """Bounded FIFO of complete groups shared by actors (writers) and one learner job (reader).

    Capacity invariant, exact at every instant (each change is one atomic script)::

        leased + unread <= capacity

    ``leased`` = live (unexpired) leases; ``unread`` = committed entries not yet delivered to
    the learner. A lease is granted only if a slot is free; commit turns the lease's slot into
    an unread entry; the learner's read() frees the slot. Delivered-but-unacked (``pending``)
    entries hold no slot, so ack-on-checkpoint cannot deadlock the actors; the learner bounds
    ``pending`` itself (it reads only what it trains before the next checkpoint).

    Conservation, for entries that came through commit(), also exact at every instant::

        committed == trained + dropped_stale + dropped_invalid + dropped_poison
                     + dropped_uniform + unread + pending

    An entry added to the stream from outside (no commit record in ``N:commits``, or another
    seq) is not a group until it is read: then it is dead-lettered and counted both
    ``committed`` and ``dropped_invalid``. ``audit()`` checks the law with such unread
    entries left out and reports any difference (the learner runs it every step).

    Nothing is ever trimmed or evicted: a full buffer blocks ``lease`` (backpressure).
    One consumer group (learner job) per buffer ``name``; acked entries are deleted.

    ``client`` must return bytes (``decode_responses=False``), e.g. ``buffer.connect(url)``.
    A dropped connection is retried for up to ``reconnect_s`` seconds, then every method
    raises ``BufferUnavailable``; once ``stop()`` is true (the role is stopping) it is not
    retried at all (``call_with_retries``). Retries are safe: commit dedupes by group_id, ack and
    dead-lettering act only on still-pending entries, and a lease granted on a lost reply
    simply expires after ``lease_ttl_s``.

    Poison: Redis keeps a delivery count per pending entry (XPENDING times_delivered; a new
    read sets 1). The learner keeps it equal to "steps started with this entry that did not
    complete": ``set_deliveries`` raises it when it hands a re-read entry to a step and sets
    it to 0 once the step completed. ``read_pending`` reads history without counting (XRANGE;
    XREADGROUP of history would count every re-read, also of entries never tried again) and
    dead-letters an entry whose count reached ``max_deliveries`` as ``dropped_poison``
    instead of handing it out again.

    Parts (composition): ``store`` (buffer/store.py: keys, scripts, retries, the consumer
    group, the wake list) and ``reads`` (buffer/stream_reads.py: the learner's side, whose
    methods this class exposes as its own).
    """

    def __init__(
        self,
        client: redis.Redis,
        name: str,
        capacity: int,
        options: BufferOptions | None = None,
        *,
        stop: Callable[[], bool] = lambda: False,
    ) -> None:
        """``capacity``: the admission limit (leased + unread slots); ``options``: leases,
        retries and payload bounds (``BufferOptions``' defaults when None); ``stop``: ends a
        reconnect wait (a role sets it to its stop flag)."""
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if not name:
            raise ValueError("name and consumer_group must be non-empty")
        if client.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError("ReplayBuffer needs a client with decode_responses=False (payloads)")
        o = options or BufferOptions()
        lease_ttl_s, consumer_group, reconnect_s = o.lease_ttl_s, o.consumer_group, o.reconnect_s
        max_deliveries, max_payload_bytes = o.max_deliveries, o.max_payload_bytes
        self.lease_ttl_s = lease_ttl_s
        self.store = BufferStore(client, name, consumer_group, capacity, reconnect_s, stop)
        self.reads = StreamReads(self.store, max_deliveries, max_payload_bytes)
        self._k = self.store.keys
        meta = self._k["meta"]
        old = self.retrying(lambda: client.hget(meta, "capacity"), [meta])
        if old is not None and self.store.as_int(meta, "capacity", old) != capacity:
            log.warning("buffer %s: capacity changed from %s to %d", name, int(old), capacity)
        self.retrying(lambda: client.hset(meta, "capacity", capacity), [meta])

    # -- the store's settings, one home each (a role sets ``stop`` after construction) ---------

    client = property(lambda self: self.store.client)
    name = property(lambda self: self.store.name)
    capacity = property(lambda self: self.store.capacity)
    consumer_group = property(lambda self: self.store.consumer_group)
    reconnect_s = property(lambda self: self.store.reconnect_s)
    max_deliveries = property(lambda self: self.reads.max_deliveries)
    max_payload_bytes = property(lambda self: self.reads.max_payload_bytes)

    @property
    def stop(self) -> Callable[[], bool]:
        """True once the role is stopping: no Redis call is retried from then on."""
        return self.store.stop

    @stop.setter
    def stop(self, stop: Callable[[], bool]) -> None:
        self.store.stop = stop

    @property
    def repairs(self) -> list[str]:
        """One line per repair of damage from outside (a rebuilt consumer group)."""
        return self.store.repairs

    def call(self, fn):
        """``fn()`` (a Redis call on ``client``) retried while the connection is down: for
        the parts that keep their own keys beside the buffer's (buffer/eval_queue.py)."""
        return self.store.call(fn)

    def retrying(self, fn, keys: list[str], on_retry=None, consumer: str = ""):
        """``BufferStore.retrying``: for the parts that run their own scripts on the
        buffer's connection (buffer/cursors.py)."""
        return self.store.retrying(fn, keys, on_retry, consumer)

    # -- the learner (buffer/stream_reads.py) ------------------------------------------------

    def read(
        self, consumer: str, count: int, block_ms: int, vocab_size: int | None = None
    ) -> list[Entry]:
        """``StreamReads.read``: up to ``count`` new valid groups, waiting up to ``block_ms``."""
        return self.reads.read(consumer, count, block_ms, vocab_size)

    def read_pending(self, consumer: str, vocab_size: int | None = None) -> list[Entry]:
        """``StreamReads.read_pending``: what ``consumer`` was handed and did not ack."""
        return self.reads.read_pending(consumer, vocab_size)

    def set_deliveries(self, consumer: str, counts: dict[str, int]) -> None:
        """``StreamReads.set_deliveries``: pending entries' delivery counts."""
        self.reads.set_deliveries(consumer, counts)

    def ack(self, entry_ids: Iterable[str], state: str) -> int:
        """``StreamReads.ack``: XACK + XDEL, counted as ``state``."""
        return self.reads.ack(entry_ids, state)

    def dead_letters(self, count: int = 100) -> list[tuple[str, str]]:
        """``StreamReads.dead_letters``: the oldest dead letters, (entry id, reason)."""
        return self.reads.dead_letters(count)

    # -- actors --------------------------------------------------------------------------------

    def lease(self, actor_id: int, timeout_s: float) -> str | None:
        """Reserve one slot, waiting up to ``timeout_s`` while the buffer is full.

        Returns a lease id (valid ``lease_ttl_s``; see ``renew``) or None on timeout.
        """
        got = self.lease_many(actor_id, 1, timeout_s)
        return got[0] if got else None

    def lease_many(
        self,
        actor_id: int,
        count: int,
        timeout_s: float,
        window: Callable[[], Window] | None = None,
    ) -> list[str]:
        """Reserve up to ``count`` slots in one round trip, waiting up to ``timeout_s`` while
        the buffer is full. Returns 1..``count`` lease ids as slots are free now (each valid
        ``lease_ttl_s``), or ``[]`` on timeout.

        ``window`` (``buffer.admission=window``): leased + unread also stays within
        ``admission_window`` of the learner's state at the moment of each try
        (buffer/staleness.py). ``window()`` is asked again at every try (the actor's weights
        may be newer by then), and a try is made at least every ``WINDOW_POLL_S``: nothing
        wakes an actor when its own weights arrive."""
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        ids = [f"{actor_id}:{secrets.token_hex(8)}" for _ in range(count)]
        keys = [self._k["leases"], self._k["stream"], self._k["meta"]]
        poll = WAKE_POLL_S if window is None else min(WAKE_POLL_S, WINDOW_POLL_S)
        deadline = time.monotonic() + timeout_s
        while True:
            w = window() if window else _NO_WINDOW
            paced = [w.weights_version, w.max_staleness, w.batch_groups]
            args = [int(self.lease_ttl_s * 1000), *paced, *ids]
            granted = int(self.store.run("LEASE", keys, args))
            if granted > 0:
                return ids[:granted]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            self._await_wake(min(remaining, poll))

    def _await_wake(self, timeout_s: float) -> None:
        """Block in Redis (BLPOP on ``<name>:wake``) until a slot may have been freed (a read
        or a release pushes a token) or ``timeout_s`` passes (a lease may expire unseen)."""
        wake = self._k["wake"]
        timeout = max(timeout_s, 0.01)
        self.retrying(lambda: self.client.blpop([wake], timeout=timeout), [wake])

    def commit(self, lease_id: str, group: Group, in_flight: tuple[str, int] | None = None) -> bool:
        """Store ``group`` and release ``lease_id`` atomically.

        Returns True if stored, False if ``group.group_id`` was committed before (nothing is
        stored; the lease is still released). Raises ``LeaseExpired`` if the lease expired and
        no slot is free (the group is not stored), ``ValueError`` for a malformed group.
        ``in_flight=(set_key, index)``: in the same script, when True or False is returned,
        ``index`` leaves that set (``PromptCursor.in_flight_entry``: the prompt is done).
        """
        payload = encode_group(group)
        keys = [self._k[k] for k in ("leases", "stream", "meta", "stats", "group_ids", "commits")]
        args: list[str | bytes | int] = [lease_id, group.group_id, payload]
        if in_flight is not None:
            keys.append(in_flight[0])
            args.append(in_flight[1])
        result = self.store.run("COMMIT", keys, args)
        if result == -1:
            raise LeaseExpired(
                f"lease {lease_id} expired (lease_ttl_s={self.lease_ttl_s}) and the buffer is "
                f"full; group {group.group_id!r} was not stored. Renew leases during long "
                "generations or raise lease_ttl_s."
            )
        return result == 1

    def release(self, lease_id: str) -> bool:
        """Give a slot back without committing. Returns False if the lease was already gone."""
        leases = self._k["leases"]
        released = bool(self.retrying(lambda: self.client.zrem(leases, lease_id), [leases]))
        if released:
            self.store.wake(1)
        return released

    def renew(self, lease_id: str) -> bool:
        """Extend a live lease by ``lease_ttl_s`` from now; False if it had already expired."""
        args = [lease_id, int(self.lease_ttl_s * 1000)]
        return self.store.run("RENEW", [self._k["leases"]], args) == 1

    # -- versions, meta, stats -----------------------------------------------------------------

    def set_learner_version(self, version: int) -> None:
        meta = self._k["meta"]
        self.retrying(lambda: self.client.hset(meta, "learner_version", int(version)), [meta])

    def set_learner_last_version(self, version: int) -> None:
        """Publish the version the learner's last step reads at (``learner.steps - 1``): the
        admission window reaches no further (buffer/staleness.py ``admission_window``), so
        the actors start no group that the run ends without reading."""
        meta = self._k["meta"]
        self.retrying(lambda: self.client.hset(meta, "learner_last_version", int(version)), [meta])

    def set_learner_wants(self, wants: int) -> None:
        """Publish how many groups the learner still needs for the step it reads (0 while it
        trains), as of the entries delivered so far: the admission window's ``wants``
        (buffer/staleness.py), which the LEASE script lowers by every entry delivered after
        this and still pending. Actors blocked in ``lease_many`` are woken to look again (a
        token that finds no room costs one LEASE)."""
        self.store.run("WANTS", [self._k["meta"]], [int(wants)])
        self.store.wake(wants)

    def learner_version(self) -> int:
        """The learner's published policy version, -1 before the first publish."""
        meta = self._k["meta"]
        v = self.retrying(lambda: self.client.hget(meta, "learner_version"), [meta])
        return -1 if v is None else self.store.as_int(meta, "learner_version", v)

    def set_meta(self, **kv: str | int | float) -> None:
        """Publish run-wide settings (e.g. ``max_staleness=4``); values are stored as strings."""
        bad = [k for k in kv if k in _RESERVED_META]
        if bad:
            raise ValueError(f"{bad} are managed by ReplayBuffer; use its methods")
        if kv:
            meta = self._k["meta"]
            self.retrying(lambda: self.client.hset(meta, mapping=kv), [meta])

    def claim_meta(self, key: str, value: str) -> str | None:
        """Set meta ``key`` to ``value`` unless it is set: None when this call set it, else
        the value set before (HSETNX: of concurrent callers exactly one sets it, and every
        other one gets that value). Once set, only ``set_meta`` changes it."""
        if key in _RESERVED_META:
            raise ValueError(f"{key!r} is managed by ReplayBuffer; use its methods")
        meta = self._k["meta"]
        if self.retrying(lambda: self.client.hsetnx(meta, key, value), [meta]):
            return None
        old = self.retrying(lambda: self.client.hget(meta, key), [meta])
        if old is None:  # set a moment ago, deleted since: nothing but a hand edit does that
            raise self.store.damaged(f"{meta} field {key} vanished right after it was set")
        return as_text(old)

    def meta(self) -> dict[str, str]:
        """All meta fields (including capacity, consumer_group, learner_version) as strings."""
        meta = self._k["meta"]
        raw = self.retrying(lambda: self.client.hgetall(meta), [meta])
        return {as_text(k): as_text(v) for k, v in raw.items()}

    def stats(self) -> dict[str, int]:
        """One atomic snapshot; see the class docstring for the invariants it satisfies.

        Raises ``BufferDamaged`` if a counter or the capacity is missing or not an integer.
        """
        values = self.store.run("STATS", self._stats_keys(), [])
        return dict(zip(scripts.STATS_FIELDS, (int(v) for v in values[:10]), strict=True))

    def leases_by_actor(self) -> dict[int, int]:
        """actor id -> its live leases (the groups it is generating now), read from Redis: a
        fact about every actor of the job, wherever it runs (``asyncrl status``)."""
        leases = self._k["leases"]

        def live():
            sec, usec = self.client.time()  # the server clock, as the scripts use
            return self.client.zrangebyscore(leases, f"({sec * 1000 + usec // 1000}", "+inf")

        out: dict[int, int] = {}
        for lease_id in self.retrying(live, [leases]):
            actor = as_text(lease_id).partition(":")[0]
            if actor.isdigit():
                out[int(actor)] = out.get(int(actor), 0) + 1
        return out

    def audit(self) -> dict[str, int]:
        """The learner's check of the buffer, one round trip: ``stats()`` plus

        - ``foreign``: entries in the stream that commit() did not add (not yet read; each is
          dead-lettered and counted ``committed`` + ``dropped_invalid`` when read),
        - ``still_buffered``: committed groups not yet in a terminal state
          (``unread + pending - foreign``),
        - ``imbalance``: ``committed - (sum of TERMINAL_STATES + still_buffered)``, 0 unless
          something outside the job changed the counters or deleted entries.

        Raises ``BufferDamaged`` if the meta no longer names this buffer's consumer group (a
        FLUSHDB or DEL), or a counter, the capacity or ``learner_version`` is not an integer.
        A consumer group destroyed from outside is rebuilt first (``regroup``, a warning).
        """
        self.store.ensure_group()
        for _ in range(2):
            values = self.store.run("STATS", self._stats_keys(), [self.consumer_group])
            fields = scripts.STATS_FIELDS + scripts.AUDIT_FIELDS
            out = dict(zip(fields, (int(v) for v in values), strict=True))
            if out.pop("group_ok"):
                break
            self.store.regroup("")
        foreign = max(0, out.pop("stream_len") - out.pop("commit_records"))
        buffered = out["unread"] + out["pending"] - foreign
        terminal = sum(out[k] for k in TERMINAL_STATES)
        return {
            **out,
            "foreign": foreign,
            "still_buffered": buffered,
            "imbalance": out["committed"] - terminal - buffered,
        }

    # -- internals -----------------------------------------------------------------------------

    def _stats_keys(self) -> list[str]:
        return [self._k[k] for k in ("stream", "leases", "stats", "meta", "commits")]
