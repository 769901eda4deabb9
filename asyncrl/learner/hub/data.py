"""Rank 0's view of the buffer: fetch fresh groups for a step, drop stale ones (counted).

The staleness bound is enforced here, right before the step that would use a group: a group
read at learner version V is trained only if ``V - version_min <= max_staleness``; every
other group is acknowledged as ``dropped_stale`` at once (a terminal state, counted once).

DAPO dynamic sampling (``drop_uniform``): a fresh group whose rewards are all equal has zero
advantage under every group baseline, so it carries no signal; it is dropped (counted in
``dropped_uniform``, a terminal state of its own) and more groups are read until the batch
is full.

Poison (a group that crashes the step every time): the buffer keeps a delivery count per
pending group and ``read_pending`` (on resume) dead-letters a group whose count reached
``buffer.max_deliveries``. ``next_batch`` keeps that count equal to "steps started with the
group that did not complete", so it singles out the culprit: (i) a re-read group handed to a
step gets count + 1 (``set_deliveries``) right before the step; (ii) the next call reports
the previous batch's step as completed (count 0), so groups trained fine before a crash are
cleared; (iii) a batch holds at most one suspect (a re-read group with count >=
``max(1, max_deliveries - 1)``), so a group that merely shared the culprit's batch is tried
next to other groups and cleared. Below that count a crashed batch is replayed as it was, so a
learner killed once (not by its data) resumes with the batches an uninterrupted run takes
(guarantee 2, tests/faults/test_learner_kills.py); the last delivery before poison isolates.
Only when no new group arrives within a second are suspects batched together. Limit: the
new groups a suspect is batched with are untested, so an innocent group that lands next to a
*different* poison group in ``max_deliveries`` crashed steps in a row is dead-lettered too
(its reason says so); with rare poison this does not happen. The failpoint
``learner.step/<group_id>`` (``asyncrl/core/runtime/faults.py``, tests only) fires right before the step
for each group of the batch.

End of the data (a finite prompt source, ``task.name=file``): ``exhausted()`` says that every
actor is out of prompts and has committed all its groups (actors/actor.py). Checked *before* a
read, an empty read after it means nothing more can arrive, so ``next_batch`` raises
``DataExhausted`` (a ``StopRequested``: the loop ends with its final checkpoint, like on a
stop). The groups of a last, partial batch stay pending (verl's ``drop_last``).

Versions ahead of the learner: actors only hold weights the learner sent, so no
token is newer than the learner's version V, or than ``ceiling``, the version this run's
learner had reached before this one started (a learner restarted from an older checkpoint
meets groups of the versions it rolled back; learner/hub/hub.py recognises the run by its
run_dir in the buffer's meta). A group newer than both was written by another run's actors or
by a foreign writer: ``next_batch`` raises ``FatalError`` naming it instead of training it at
a negative staleness.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from asyncrl.buffer.staleness import split_by_staleness
from asyncrl.core.runtime.fatal import FatalError
from asyncrl.core.runtime.faults import failpoint
from asyncrl.core.runtime.waiting import StopRequested, Wait, never
from asyncrl.learner.algo.advantages import all_equal_groups

if TYPE_CHECKING:
    from asyncrl.buffer.faces import LearnerBuffer

_UNIFORM_ACK_STATE = "dropped_uniform"  # terminal state of groups dropped as all-equal
_UNIFORM_ATOL = 1e-6  # rewards closer than this are "equal" (float noise of reward functions)


class DataTimeout(TimeoutError):
    """No fresh group arrived within ``learner.data_timeout_s``."""


class DataExhausted(StopRequested):
    """Every actor is out of prompts (``data.epochs`` done) and no group is left to read."""

    def __init__(self, text: str) -> None:
        Exception.__init__(self, text)
        self.what = "fresh groups"


@dataclass
class GroupSource:
    """Pulls entries for one learner job (consumer ``consumer`` of the buffer's group)."""

    buffer: LearnerBuffer
    consumer: str
    vocab_size: int | None
    max_staleness: int
    timeout_s: float
    drop_uniform: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal."""
    admit_by_newest: bool = False
    """``algorithm.stale_tokens=mask|interpolate``: a group is fresh while its newest token is within the
    bound (its older tokens leave the loss: learner/algo/stale_tokens.py), not its oldest."""
    dropped_stale: int = 0
    dropped_uniform: int = 0
    stop: Callable[[], bool] = never
    """True once a stop was requested: a wait for data raises ``StopRequested`` at once."""
    say: Callable[[str], None] = print
    """Prints a progress line of a long wait for data (asyncrl/core/runtime/waiting.py)."""
    exhausted: Callable[[], bool] = never
    """True once every actor is out of prompts and committed its last group (module doc)."""
    interrupt: Callable[[], bool] = never
    """True when the read should pause for something else (actors that registered again and
    wait for weights while the learner waits for their groups: see ``next_batch``)."""
    on_read: Callable[[list], None] = lambda groups: None
    """Called with the groups of every read, before admission (``RunTotals.count_read``)."""
    wants: Callable[[int], None] = lambda count: None
    """Told how many groups the step being read still needs before each read of new groups
    (not of groups re-read after a restart, which take no slot), and 0 once the batch is full
    (``buffer.admission=window``: ``ReplayBuffer.set_learner_wants``; the buffer counts the
    entries delivered after it, still pending, against it)."""
    ceiling: int = -1
    """The version this run's learner had reached before this one started (the buffer's
    ``learner_version`` when its ``learner_run_dir`` is this run's; else -1): groups up to it
    or to V are possible (module doc)."""
    _pending: list = field(default_factory=list)
    _held: list = field(default_factory=list)
    _held_wait: Wait | None = None
    _last_batch: list = field(default_factory=list)
    _resumed: set = field(default_factory=set)

    def resume(self) -> int:
        """Re-read entries delivered to this consumer before a restart; returns how many.

        Entries delivered too often (poison) are dead-lettered by the buffer, not returned.
        """
        self._pending = list(self.buffer.read_pending(self.consumer, self.vocab_size))
        self._resumed = {e.entry_id for e in self._pending}
        return len(self._pending)

    def next_batch(self, version: int, count: int) -> list | None:
        """Exactly ``count`` fresh entries (blocking); stale ones are dropped on the way.

        None when ``interrupt()`` turned true while no data came: the entries read so far are
        held for the next call (the learner sends weights to actors that registered again,
        which generate nothing until they have them, then reads on).
        Calling it means the step of the previous batch completed (see module docstring).
        """
        self.step_done()
        fresh, self._held = self._held, []
        # after a pause for a sync the deadline goes on: pauses do not extend it
        wait, self._held_wait = self._held_wait or self._data_wait(version, count), None
        while len(fresh) < count:
            want = count - len(fresh)
            entries = self._take_pending(want, fresh)
            done = not entries and self.exhausted()  # before the read: see module docstring
            if not entries:
                self.wants(want)  # the buffer counts what this read delivers against it
                entries = self.buffer.read(self.consumer, want, 1000, self.vocab_size)
            if not entries and self._pending:  # only suspects left and no new data: mix them
                entries, self._pending = self._pending[:want], self._pending[want:]
            if not entries and done:
                left = (
                    f" ({len(fresh)} group(s) of a partial batch stay untrained)" if fresh else ""
                )
                raise DataExhausted(
                    "the actors have no prompts left (data.epochs done) and no group is left "
                    f"to read: ending the run at version {version}{left}"
                )
            self.on_read([e.group for e in entries])
            self._check_versions(entries, version)
            ok, stale = split_by_staleness(
                entries, version, self.max_staleness, self.admit_by_newest
            )
            if stale:
                self.buffer.ack([e.entry_id for e in stale], "dropped_stale")
                self.dropped_stale += len(stale)
            if self.drop_uniform:
                ok = self._drop_uniform(ok)
            fresh.extend(ok)
            if ok:  # progress: a new deadline
                wait = self._data_wait(version, count)
            elif self.interrupt():
                self._held, self._held_wait = fresh, wait
                return None
            else:
                wait.check(
                    f"have {len(fresh)}/{count}; dropped so far: {self.dropped_stale} stale, "
                    f"{self.dropped_uniform} with all-equal rewards"
                )
        self.wants(0)
        self._start_step(fresh)
        for e in fresh:  # test-only fault injection: "this group crashes the step"
            failpoint(f"learner.step/{e.group.group_id}", version=version)
        return fresh

    def _check_versions(self, entries: list, version: int) -> None:
        """``FatalError`` for a group with tokens newer than any version this buffer's learners
        reached (module doc): impossible from our actors."""
        limit = max(version, self.ceiling)
        ahead = [e for e in entries if e.group.version_max > limit]
        if ahead:
            g = ahead[0].group
            raise FatalError(
                f"group {g.group_id!r} (actor {g.actor_id}) has tokens of policy version "
                f"{g.version_max}, but this learner is at version {version} and this run's "
                f"learners never passed {max(self.ceiling, version)}: another run's actors, or "
                "another writer, use this buffer. One buffer serves one run: give each job its "
                "own buffer.name"
            )

    def _data_wait(self, version: int, count: int) -> Wait:
        return Wait(
            f"fresh groups for the step at version {version}",
            self.timeout_s,
            self.say,
            self.stop,
            hint=(
                "are the actors running and pointed at the same buffer.url and buffer.name? "
                "(if only all-equal groups arrive, the task is saturated: set "
                "algorithm.dynamic_sampling=false)"
            ),
            timeout_error=DataTimeout,
        )

    def step_done(self) -> None:
        """The step of the last batch completed: clear its groups' delivery counts (the
        learner calls it right after a step; ``next_batch`` calls it too, idempotent)."""
        if self._last_batch:
            self.buffer.set_deliveries(self.consumer, dict.fromkeys(self._last_batch, 0))
            self._last_batch = []

    def _start_step(self, batch: list) -> None:
        """Count the coming step as a delivery of each re-read entry (new reads count 1)."""
        again = {e.entry_id: e.deliveries + 1 for e in batch if e.entry_id in self._resumed}
        if again:
            self.buffer.set_deliveries(self.consumer, again)
            self._resumed -= set(again)
        self._last_batch = [e.entry_id for e in batch]

    def _take_pending(self, want: int, batch: list) -> list:
        """Up to ``want`` re-read entries for ``batch``, at most one suspect per batch.

        A suspect (see ``_suspect``) was in steps that did not complete; keeping suspects apart
        lets the innocent ones complete a step and clear their count.
        """
        suspect_in_batch = any(self._suspect(e) for e in batch)
        taken: list = []
        kept: list = []
        for e in self._pending:
            suspect = self._suspect(e)
            if len(taken) < want and not (suspect and suspect_in_batch):
                taken.append(e)
                suspect_in_batch = suspect_in_batch or suspect
            else:
                kept.append(e)
        self._pending = kept
        return taken

    def _suspect(self, entry) -> bool:
        limit = max(1, getattr(self.buffer, "max_deliveries", 2) - 1)
        return entry.entry_id in self._resumed and entry.deliveries >= limit

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
