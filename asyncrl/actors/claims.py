"""An actor's side of the buffer protocol: claim slots and prompts, commit groups.

``Claims`` owns the prompt cursor and the sync quota of one actor and talks to its
``ReplayBuffer`` (the ``ActorBuffer`` face); ``actors/actor.py`` calls it from worker threads
(every call is blocking).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from asyncrl.buffer.cursors import PromptCursor, SyncQuota
from asyncrl.buffer.staleness import Window, within_staleness
from asyncrl.core.types import Group

if TYPE_CHECKING:
    from asyncrl.buffer.faces import ActorBuffer
    from asyncrl.core.config.job import Config


class Claims:
    """Admission, leases and prompt indices for up to N groups at once, and their commits.

    ``track(index) -> index`` sees every index handed out (the actor's epoch messages)."""

    def __init__(
        self,
        buffer: ActorBuffer,
        actor_id: int,
        cfg: Config,
        end: int | None,
        window: Callable[[], int] | None = None,
    ) -> None:
        """``cfg`` gives the stride (``actor.total``: every actor of the job), the batch, the
        staleness bound and the mode; ``end``: the prompt source's end (None: endless)."""
        self.buffer, self.actor_id = buffer, actor_id
        self.cursor = PromptCursor(buffer, actor_id, cfg.actor.total, end)
        self.quota = SyncQuota(buffer, cfg.learner.batch_groups)  # used in mode=sync only
        self.max_staleness, self.sync = cfg.buffer.max_staleness, cfg.mode.name == "sync"
        batch_groups, max_staleness = cfg.learner.batch_groups, self.max_staleness
        self.paced = (lambda: Window(window(), max_staleness, batch_groups)) if window else None
        """``buffer.admission=window`` (``window()``: the version of the weights the actor
        holds): the admission window of each try of a lease, which stays within it."""

    def claim(
        self, want: int, version: int, weights_valid: bool, track: Callable[[int], int]
    ) -> tuple[str, list[tuple[str, int]]]:
        """Admission, up to ``want`` buffer slots and as many prompt indices, in three round
        trips to Redis however many groups (a round trip waits for a time slice on the core
        the engine shares).

        Returns ``("refused", [])`` when weights of ``version`` are too stale for the
        staleness bound (``asyncrl.buffer.staleness``) or, in sync mode, the version's quota is used
        up (``asyncrl.buffer.cursors.SyncQuota``); ``("full", [])`` when no slot freed within
        1 s (with ``window``: none within the admission window, ``admission_window``);
        ``("ok", claims)`` with 1..``want`` (lease, index) pairs; ``("exhausted", claims)``
        once the prompts ran out (the leases without an index were released)."""
        learner_v = self.buffer.learner_version()
        fresh = weights_valid and within_staleness(learner_v, version, self.max_staleness)
        if fresh and self.sync:
            want = self.quota.take_many(version, want)
        if not fresh or want == 0:
            return "refused", []
        leases = self.buffer.lease_many(self.actor_id, want, 1.0, self.paced)
        if self.sync:
            self.quota.give_back(version, want - len(leases))
        if not leases:
            return "full", []
        indices = [track(i) for i in self.cursor.next_many(len(leases))]
        for lease in leases[len(indices) :]:
            self.buffer.release(lease)
        claims = list(zip(leases[: len(indices)], indices, strict=True))
        return "ok" if len(indices) == len(leases) else "exhausted", claims

    def commit(
        self, lease: str, group: Group, index: int, stopped: Callable[[], bool]
    ) -> bool | None:
        """Commit, taking ``index`` out of the cursor's in-flight set in the same script; if
        the lease expired meanwhile and the buffer is full, wait for a new slot.

        True: stored; False: committed before (duplicate); None: ``stopped()`` before a slot
        freed (the index stays in flight for a restart).
        """
        from asyncrl.buffer.redis_buffer import LeaseExpired

        done = self.cursor.in_flight_entry(index)
        try:
            return self.buffer.commit(lease, group, done)
        except LeaseExpired:
            while not stopped():
                again = self.buffer.lease(self.actor_id, 1.0)
                if again is not None:
                    return self.buffer.commit(again, group, done)
            return None
