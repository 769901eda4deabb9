"""Rank 0's view of the buffer: fetch fresh groups for a step, drop stale ones (counted).

The staleness bound is enforced here, right before the step that would use a group: a group
read at learner version V is trained only if ``V - version_min <= max_staleness``; every
other group is acknowledged as ``dropped_stale`` at once (a terminal state, counted once).

DAPO dynamic sampling (``drop_uniform``): a fresh group whose rewards are all equal has zero
advantage under every group baseline, so it carries no signal; it is dropped (counted in
``dropped_uniform``) and more groups are read until the batch is full.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from buffer.staleness import split_by_staleness
from learner.advantages import all_equal_groups

# The buffer has no terminal state for "read, but dropped for carrying no signal": these groups
# are consumed by the learner (their gradient would be exactly 0), so they count as trained;
# ``dropped_uniform`` tells them apart. Switch to a dedicated state once the buffer has one.
_UNIFORM_ACK_STATE = "trained"
_UNIFORM_ATOL = 1e-6  # rewards closer than this are "equal" (float noise of reward functions)


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
    drop_uniform: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal."""
    dropped_stale: int = 0
    dropped_uniform: int = 0
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
            if self.drop_uniform:
                ok = self._drop_uniform(ok)
            fresh.extend(ok)
            if ok:
                deadline = time.monotonic() + self.timeout_s
            elif time.monotonic() > deadline:
                raise DataTimeout(
                    f"no fresh group for {self.timeout_s:.0f}s at version {version} "
                    f"(have {len(fresh)}/{count}; dropped so far: {self.dropped_stale} stale, "
                    f"{self.dropped_uniform} with all-equal rewards); are the actors running "
                    "and pointed at the same buffer.url and buffer.name? (if only all-equal "
                    "groups arrive, the task is saturated: set algorithm.dynamic_sampling=false)"
                )
        return fresh

    def _drop_uniform(self, entries: list) -> list:
        """Ack and count the entries whose group rewards are all equal; return the others."""
        if not entries:
            return entries
        rewards = torch.tensor([e.group.rewards for e in entries], dtype=torch.float64)
        uniform = all_equal_groups(rewards, atol=_UNIFORM_ATOL).tolist()
        drop = [e for e, u in zip(entries, uniform, strict=True) if u]
        if drop:
            self.buffer.ack([e.entry_id for e in drop], _UNIFORM_ACK_STATE)
            self.dropped_uniform += len(drop)
        return [e for e, u in zip(entries, uniform, strict=True) if not u]
