"""The learner's side of ``ReplayBuffer`` (buffer/redis_buffer.py): reading groups from the
stream, recovering a read whose reply was lost, re-reading pending entries after a restart,
counting deliveries (poison), acking and dead-lettering what is not a valid group. The
actors' side and the shared state (meta, stats, the audit) are in redis_buffer.py; the
plumbing (retries, damage reports) and the single consumer group in store.py.

``ReplayBuffer`` holds one ``StreamReads`` (composition): it reads and writes through the
buffer's ``BufferStore`` (buffer/store.py: keys, scripts, retries, the consumer group, the
wake list) and keeps what only the reads need, the hand-out records. The invariants are
``ReplayBuffer``'s docstring.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

from asyncrl.buffer.codec import DEFAULT_MAX_BYTES, PayloadError, decode_group
from asyncrl.buffer.store import BufferStore, as_text
from asyncrl.core.types import Group

log = logging.getLogger(
    "asyncrl.buffer.redis_buffer"
)  # one logger for the buffer, as before the split

ACK_STATES = ("trained", "dropped_stale", "dropped_uniform")
"""States the learner acks with; dropped_invalid/dropped_poison are set by the buffer."""
_ENTRY_ID = re.compile(r"[0-9]+-[0-9]+")


@dataclass(frozen=True)
class Entry:
    """One delivered group. ``deliveries``: Redis's delivery count of the entry (XPENDING
    times_delivered): 1 for a new read; for a re-read pending entry, the number of steps it
    was handed to that did not complete (see ``ReplayBuffer.set_deliveries``)."""

    entry_id: str
    group: Group
    deliveries: int


class StreamReads:
    """The learner's reads, acks and dead letters of ``store``'s stream (module docstring).
    ``max_deliveries``: the poison bound (``read_pending``); ``max_payload_bytes``: the
    largest payload decoded."""

    def __init__(
        self,
        store: BufferStore,
        max_deliveries: int = 3,
        max_payload_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.store = store
        self.max_deliveries, self.max_payload_bytes = max_deliveries, max_payload_bytes
        self._handed: dict[str, set[str]] = {}  # consumer -> entry ids handed out, not acked
        self._maybe_lost: set[str] = set()  # consumers whose read reply may have been lost

    def read(
        self, consumer: str, count: int, block_ms: int, vocab_size: int | None = None
    ) -> list[Entry]:
        """Up to ``count`` new valid groups, waiting up to ``block_ms`` (0 = do not wait).

        Malformed entries are dead-lettered and skipped; reading continues until a valid
        entry arrives or the wait is over. Returned entries stay pending until ``ack``.
        """
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        self.store.ensure_group()
        block_ms = self._clamp_block(block_ms)
        deadline = time.monotonic() + block_ms / 1000
        while True:
            if recovered := self._recover(consumer, count, vocab_size):
                return self._hand(consumer, recovered)
            wait_ms = int((deadline - time.monotonic()) * 1000)
            raw = self._xreadgroup(consumer, ">", count, wait_ms if wait_ms > 0 else None)
            seqs = self._delivered(consumer, [eid for eid, _ in raw])
            self.store.wake(len(raw))  # delivered entries no longer take slots
            decoded = (self._decode(eid, f, 1, vocab_size, seqs.get(eid)) for eid, f in raw)
            valid = [e for e in decoded if e]
            if valid or (not raw and consumer not in self._maybe_lost):
                return self._hand(consumer, valid)

    def _hand(self, consumer: str, entries: list[Entry]) -> list[Entry]:
        """Record ``entries`` as handed to ``consumer`` (until acked) and return them."""
        self._handed.setdefault(consumer, set()).update(e.entry_id for e in entries)
        return entries

    def _recover(self, consumer: str, count: int, vocab_size) -> list[Entry]:
        """Up to ``count`` entries delivered to ``consumer`` by a read whose reply was lost.

        A connection that drops after Redis ran XREADGROUP loses the reply: the entries are
        pending for ``consumer`` but nobody holds them. After any retried read, the pending
        entries this object never handed out are found (XPENDING) and handed out now.
        """
        if consumer not in self._maybe_lost:
            return []
        handed = self._handed.get(consumer, set())
        orphans = [eid for eid in self._delivery_counts(consumer) if eid not in handed]
        if len(orphans) <= count:
            self._maybe_lost.discard(consumer)
        orphans = orphans[:count]
        if not orphans:
            return []
        fields, seqs = self._fields(orphans), self._delivered(consumer, orphans)
        log.warning(
            "buffer %s: recovered %d group(s) whose read reply was lost",
            self.store.name,
            len(orphans),
        )
        entries = (
            self._decode(eid, fields.get(eid), 1, vocab_size, seqs.get(eid)) for eid in orphans
        )
        return [e for e in entries if e]

    def read_pending(self, consumer: str, vocab_size: int | None = None) -> list[Entry]:
        """All entries delivered to ``consumer`` but not acked (to resume after a restart).

        Re-reading does not count as a delivery. An entry whose delivery count reached
        ``max_deliveries`` is poison: it is dead-lettered (``dropped_poison``), not returned.
        """
        self.store.ensure_group()
        counts = self._delivery_counts(consumer)
        if not counts:
            return []
        fields, seqs = self._fields(list(counts)), self._delivered(consumer, list(counts))
        entries = []
        for eid, deliveries in counts.items():
            if deliveries >= self.max_deliveries:
                self._poison(eid, fields.get(eid), deliveries)
            elif entry := self._decode(eid, fields.get(eid), deliveries, vocab_size, seqs.get(eid)):
                entries.append(entry)
        return self._hand(consumer, entries)

    def set_deliveries(self, consumer: str, counts: dict[str, int]) -> None:
        """Set the delivery count of pending entries: {entry id: count}.

        The learner sets ``count + 1`` when it hands a re-read entry to a step and 0 once a
        step with the entry completed, so a group trained fine is never mistaken for poison;
        only the entries of a step that keeps crashing reach ``max_deliveries``. Entries no
        longer pending are ignored.
        """
        by_count: dict[int, list[str]] = {}
        for eid, n in counts.items():
            by_count.setdefault(int(n), []).append(eid)
        self.store.ensure_group()
        stream, group = self.store.keys["stream"], self.store.consumer_group
        for n, ids in by_count.items():
            ids = self._check_ids(ids)
            self.store.retrying(
                lambda ids=ids, n=n: self.store.client.xclaim(
                    stream, group, consumer, 0, ids, retrycount=n, justid=True
                ),
                [stream],
                consumer=consumer,
            )

    def ack(self, entry_ids: Iterable[str], state: str) -> int:
        """XACK + XDEL ``entry_ids`` and count them as ``state`` (one of ``ACK_STATES``).

        Idempotent per entry: only entries still pending are counted. Returns that number.
        """
        if state not in ACK_STATES:
            raise ValueError(f"state must be one of {ACK_STATES}, got {state!r}")
        ids = self._check_ids(entry_ids)
        if not ids:
            return 0
        self.store.ensure_group()
        for handed in self._handed.values():
            handed.difference_update(ids)
        keys = [self.store.keys["stream"], self.store.keys["stats"], self.store.keys["commits"]]
        return int(self.store.run("ACK", keys, [self.store.consumer_group, state, *ids]))

    def dead_letters(self, count: int = 100) -> list[tuple[str, str]]:
        """The oldest ``count`` dead letters as (original entry id, reason)."""
        rows = self.store.call(
            lambda: self.store.client.xrange(self.store.keys["dead"], count=count)
        )
        return [(as_text(f[b"entry_id"]), as_text(f[b"reason"])) for _, f in rows]

    # -- internals of the reads ------------------------------------------------------------

    @staticmethod
    def _check_ids(entry_ids: Iterable[str]) -> list[str]:
        """``entry_ids`` as a list; ValueError if one is not a stream id (Lua has no rollback)."""
        ids = list(entry_ids)
        bad = [i for i in ids if not _ENTRY_ID.fullmatch(i)]
        if bad:
            raise ValueError(f"not stream entry ids: {bad[:3]}")
        return ids

    def _delivery_counts(self, consumer: str) -> dict[str, int]:
        """{entry id: delivery count} of every entry pending for ``consumer``, oldest first."""
        counts: dict[str, int] = {}
        start, stream = "-", self.store.keys["stream"]
        while rows := self.store.retrying(
            lambda start=start: self.store.client.xpending_range(
                stream, self.store.consumer_group, start, "+", 1000, consumer
            ),
            [stream],
            consumer=consumer,
        ):
            counts.update((as_text(r["message_id"]), int(r["times_delivered"])) for r in rows)
            start = "(" + as_text(rows[-1]["message_id"])
        return counts

    def _fields(self, ids: list[str]) -> dict[str, dict]:
        """{entry id: fields} for the still-existing ``ids`` (XRANGE, counts no delivery)."""
        wanted = set(ids)
        out: dict[str, dict] = {}
        lo, hi = min(ids, key=_id_key), max(ids, key=_id_key)
        while rows := self.store.call(
            lambda lo=lo: self.store.client.xrange(self.store.keys["stream"], lo, hi, count=1000)
        ):
            out.update((eid, f) for eid, f in ((as_text(i), f) for i, f in rows) if eid in wanted)
            lo = "(" + as_text(rows[-1][0])
        return out

    def _delivered(self, consumer: str, ids: list[str]) -> dict[str, bytes | None]:
        """Record ``ids`` as delivered to ``consumer`` (meta ``delivered_upto``, which
        ``BufferStore.regroup`` needs) and return {entry id: seq that commit() gave it, or None}."""
        keys = [self.store.keys["meta"], self.store.keys["commits"]]
        out: dict[str, bytes | None] = {}
        for i in range(0, len(ids), 1000):  # bounded script arguments
            chunk = ids[i : i + 1000]
            seqs = self.store.run("DELIVERED", keys, [consumer, *chunk])
            out.update(zip(chunk, seqs, strict=True))
        return out

    def _poison(self, entry_id: str, fields, deliveries: int) -> None:
        """Dead-letter a pending entry that was handed to ``deliveries`` steps in vain."""
        reason = (
            f"poison: delivered {deliveries} times, and no step with it completed (the learner "
            f"crashed or was stopped each time; buffer.max_deliveries={self.max_deliveries})"
        )
        self._dead_letter(entry_id, reason, (fields or {}).get(b"payload", b""), "dropped_poison")

    def _dead_letter(self, entry_id: str, reason: str, payload: bytes, counter: str) -> None:
        """Move a pending entry to ``N:dead`` with ``reason``, counted as ``counter`` (and as
        committed too if commit() did not add it: DEAD_LETTER checks its commit record)."""
        keys = [self.store.keys[k] for k in ("stream", "dead", "stats", "commits")]
        args = [self.store.consumer_group, entry_id, reason, payload, counter]
        self.store.run("DEAD_LETTER", keys, args)
        log.warning("buffer %s: dead-lettered %s: %s", self.store.name, entry_id, reason)

    def _clamp_block(self, block_ms: int) -> int:
        # A BLOCK longer than the socket timeout would surface as a spurious TimeoutError.
        timeout = self.store.client.connection_pool.connection_kwargs.get("socket_timeout")
        if timeout:
            block_ms = min(block_ms, max(0, int(timeout * 1000) - 1000))
        return max(0, block_ms)

    def _xreadgroup(self, consumer: str, start: str, count: int, block_ms: int | None) -> list:
        """[(entry_id, fields | None)] for ``start`` ('>' new, or an id for pending history)."""
        stream = self.store.keys["stream"]

        def go():
            return self.store.client.xreadgroup(
                self.store.consumer_group, consumer, {stream: start}, count=count, block=block_ms
            )

        lost = (lambda: self._maybe_lost.add(consumer)) if start == ">" else None
        reply = self.store.retrying(go, [stream], lost, consumer=consumer) or []
        streams = reply.items() if isinstance(reply, dict) else reply  # RESP3 | RESP2
        return [(as_text(eid), fields) for _, rows in streams for eid, fields in rows or []]

    def _decode(
        self, entry_id: str, fields, deliveries: int, vocab_size, seq: bytes | None
    ) -> Entry | None:
        """The entry's group, or None after dead-lettering it with the reason. ``seq``: what
        commit() recorded for this entry id (``N:commits``), None if it did not add it."""
        fields = fields or {}
        payload = fields.get(b"payload", b"")
        try:
            if not fields:
                raise PayloadError("entry was deleted from the stream while pending")
            if b"payload" not in fields:
                raise PayloadError("entry has no payload field")
            group = decode_group(payload, vocab_size, self.max_payload_bytes)
            if b"seq" not in fields:
                raise PayloadError("entry was not added by ReplayBuffer.commit (no seq field)")
            if seq != fields[b"seq"]:
                given = "none: it added no such entry" if seq is None else as_text(seq)
                raise PayloadError(
                    f"forged seq: the entry says seq={as_text(fields[b'seq'])!r}, commit() gave "
                    f"entry {entry_id} {given} ({self.store.keys['commits']}); it was written from "
                    "outside the job"
                )
            if as_text(fields.get(b"group_id", b"")) != group.group_id:
                raise PayloadError(
                    f"entry group_id {as_text(fields.get(b'group_id', b''))!r} != payload "
                    f"{group.group_id!r}"
                )
            return Entry(entry_id, group, deliveries)
        except PayloadError as e:
            self._dead_letter(entry_id, e.reason, payload, "dropped_invalid")
            return None


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq)
