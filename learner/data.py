"""Rank 0's view of the buffer: fetch fresh groups for a step, drop stale ones (counted).

The staleness bound is enforced here, right before the step that would use a group: a group
read at learner version V is trained only if ``V - version_min <= max_staleness``; every
other group is acknowledged as ``dropped_stale`` at once (a terminal state, counted once).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from buffer.staleness import split_by_staleness


class DataTimeout(RuntimeError):
    """No fresh group arrived within ``learner.data_timeout_s``."""


@dataclass
class GroupSource:
    """Pulls entries for one learner job (consumer ``consumer`` of the buffer's group)."""

    buffer: object
    consumer: str
    vocab_size: int | None
    max_staleness: int
    timeout_s: float
    dropped_stale: int = 0
    _pending: list = field(default_factory=list)

    def resume(self) -> int:
        """Re-read entries delivered to this consumer before a restart; returns how many."""
        self._pending = list(self.buffer.read_pending(self.consumer))
        return len(self._pending)

    def next_batch(self, version: int, count: int) -> list:
        """Exactly ``count`` fresh entries (blocking); stale ones are dropped on the way."""
        fresh: list = []
        deadline = time.monotonic() + self.timeout_s
        while len(fresh) < count:
            want = count - len(fresh)
            entries, self._pending = self._pending[:want], self._pending[want:]
            if not entries:
                entries = self.buffer.read(self.consumer, want, 1000, self.vocab_size)
            ok, stale = split_by_staleness(entries, version, self.max_staleness)
            if stale:
                self.buffer.ack([e.entry_id for e in stale], "dropped_stale")
                self.dropped_stale += len(stale)
            fresh.extend(ok)
            if ok:
                deadline = time.monotonic() + self.timeout_s
            elif time.monotonic() > deadline:
                raise DataTimeout(
                    f"no fresh group for {self.timeout_s:.0f}s at version {version} "
                    f"(have {len(fresh)}/{count}); are the actors running and pointed at the "
                    "same buffer.url and buffer.name?"
                )
        return fresh
