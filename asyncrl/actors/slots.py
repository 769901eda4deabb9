"""The actor's engine slots: how many groups may generate at once (``actor.max_inflight``)."""

from __future__ import annotations

import asyncio


class Slots:
    """``size`` slots, taken by the producer and given back by group tasks (one event loop).

    ``take`` waits until at least one slot is free, then takes every free one: groups that
    finished together are refilled by one claim (one round trip to the buffer for all of
    them, ``asyncrl.actors.claims.Claims.claim``), not one per group. On the demo's shared core a buffer
    round trip waits for a time slice, and one claim per group left the engine's batch short.

    Invariant: ``free`` + the slots taken and not given back == ``size``.
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"need at least one slot, got {size}")
        self.size = self.free = size
        self._freed = asyncio.Event()

    async def take(self) -> int:
        """Wait for a free slot; take every free slot and return how many (>= 1)."""
        while self.free == 0:
            self._freed.clear()
            await self._freed.wait()
        taken, self.free = self.free, 0
        return taken

    def give(self, count: int = 1) -> None:
        """Give ``count`` slots back (0 is a no-op)."""
        if count < 0 or self.free + count > self.size:
            raise ValueError(f"cannot give back {count} slots: {self.free} of {self.size} free")
        self.free += count
        if count:
            self._freed.set()
