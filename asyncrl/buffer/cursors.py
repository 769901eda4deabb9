"""Per-actor state of a job kept next to its buffer: the prompt cursor and the sync quota.

Keys of a buffer named ``N`` (besides those of ``buffer/scripts.py``)::

    N:cursor:<i>    string: how many prompt indices actor i has claimed (its stride position)
    N:inflight:<i>  set: indices actor i claimed whose group is not known to be committed
    N:quota:<v>     string: groups admitted under weight version v (mode=sync only)

Prompt cursor. Actor ``i`` of ``K`` takes prompts ``i, i+K, i+2K, ...``. ``CLAIM_INDEX``
advances ``N:cursor:<i>`` and adds the index to ``N:inflight:<i>`` in one script, so a kill
can never separate the two; the index leaves the set only when its group was committed, or
found committed before: in the same COMMIT script (``ReplayBuffer.commit(...,
in_flight=in_flight_entry(index))``, what actors do) or in ``done``. Hence, across any
number of kills:

- every index below the cursor was claimed once and is either committed or in the set, and
  a restarted actor re-generates the set (``resume``) before claiming new indices, so no
  prompt is skipped;
- an index is claimed by one actor and once; it is *generated* again only if a kill fell
  before its commit (or, with ``done``, between the commit and ``done``), and commit dedupes
  by group id (``task_seed:index``), so it is stored once (the actor counts a duplicate).

That holds while the mapping index -> prompt and the stride ``K`` stay fixed
(actors/data/identity.py checks it at start).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis.commands.core import Script

    from asyncrl.buffer.faces import BufferHandle

# KEYS: cursor, inflight   ARGV: actor_id, num_actors, end (-1 = endless), count
# Claims the next ``count`` indices of this actor's stride and records them as in flight,
# atomically; returns them (fewer, or none, once the stride reaches ``end``, where the
# cursor stops).
CLAIM_INDEX = """
local k = tonumber(redis.call('GET', KEYS[1]) or '0')
local first, stride, stop = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local claimed = {}
for _ = 1, tonumber(ARGV[4]) do
  local index = first + k * stride
  if stop >= 0 and index >= stop then break end
  redis.call('SADD', KEYS[2], index)
  claimed[#claimed + 1] = index
  k = k + 1
end
if #claimed > 0 then redis.call('SET', KEYS[1], k) end
return claimed
"""


def cursor_key(name: str, actor_id: int) -> str:
    """``N:cursor:<i>``: how many indices actor ``actor_id`` of buffer ``name`` claimed."""
    return f"{name}:cursor:{actor_id}"


def inflight_key(name: str, actor_id: int) -> str:
    """``N:inflight:<i>``: the indices actor ``actor_id`` claimed and has not marked done."""
    return f"{name}:inflight:{actor_id}"


class PromptCursor:
    """Actor ``actor_id``'s exactly-once claim of prompt indices (module docstring).

    ``buffer`` is a ``ReplayBuffer`` (a ``BufferHandle``): its client and its
    reconnect-and-retry policy are used.
    ``end`` (None = endless) is the first index a finite source does not have. Calls are
    blocking; one thread at a time (the actor runs them one by one in worker threads).
    """

    def __init__(
        self, buffer: BufferHandle, actor_id: int, num_actors: int, end: int | None
    ) -> None:
        if actor_id < 0 or num_actors < 1:
            raise ValueError(
                f"need actor_id >= 0 and num_actors >= 1, got {actor_id}, {num_actors}"
            )
        if end is not None and end < 0:
            raise ValueError(f"end must be >= 0 or None, got {end}")
        self.buffer = buffer
        self.actor_id, self.num_actors, self.end = actor_id, num_actors, end
        self.keys = [cursor_key(buffer.name, actor_id), inflight_key(buffer.name, actor_id)]
        # registered on first claim: building a cursor touches no Redis
        self._script: Script | None = None
        self._leftover: list[int] | None = None  # resume()d, not yet handed out again

    def claimed(self) -> int:
        """How many indices this actor has claimed so far (its stride position)."""
        return int(self._redis(lambda: self.buffer.client.get(self.keys[0])) or 0)

    def in_flight(self) -> list[int]:
        """Indices claimed and not ``done`` (ascending): an earlier run's, after a kill."""
        raw = self._redis(lambda: self.buffer.client.smembers(self.keys[1]))
        return sorted(int(i) for i in raw)

    def resume(self) -> list[int]:
        """Read the indices an earlier run left in flight; ``next`` hands them out first.

        Call once, before the first ``next`` (which calls it otherwise); returns them.
        """
        self._leftover = self.in_flight()
        return list(self._leftover)

    def next(self) -> int | None:
        """The next index to generate: an earlier run's leftovers first, then a fresh claim.
        None once a finite source has no index left for this actor."""
        got = self.next_many(1)
        return got[0] if got else None

    def next_many(self, count: int) -> list[int]:
        """Up to ``count`` indices to generate (leftovers first, then fresh claims, in one
        round trip); fewer only once a finite source runs out for this actor."""
        if self._leftover is None:
            self.resume()
        assert self._leftover is not None
        taken, self._leftover = self._leftover[:count], self._leftover[count:]
        return taken + (self.claim_many(count - len(taken)) if count > len(taken) else [])

    def claim(self) -> int | None:
        """Claim a new index (advance the cursor and record it in flight, atomically)."""
        got = self.claim_many(1)
        return got[0] if got else None

    def claim_many(self, count: int) -> list[int]:
        """Claim up to ``count`` new indices in one script (``CLAIM_INDEX``)."""
        script = self._script
        if script is None:
            script = self._script = self.buffer.client.register_script(CLAIM_INDEX)
        end = -1 if self.end is None else self.end
        args = [self.actor_id, self.num_actors, end, count]
        return [int(i) for i in self._redis(lambda: script(self.keys, args))]

    def done(self, index: int) -> None:
        """The group of ``index`` is in the buffer: it is no longer in flight."""
        self._redis(lambda: self.buffer.client.srem(self.keys[1], index))

    def in_flight_entry(self, index: int) -> tuple[str, int]:
        """``(set key, index)`` for ``ReplayBuffer.commit(..., in_flight=...)``: the commit
        that stores ``index``'s group marks it done in the same script."""
        return self.keys[1], index

    def _redis(self, fn):
        # A retried claim whose reply was lost claims the next index too; the lost one stays
        # in the in-flight set and is generated after the next restart (nothing is skipped).
        return self.buffer.retrying(fn, self.keys)


# KEYS: quota   ARGV: per_version, count   Admits min(count, per_version - admitted so far).
TAKE_QUOTA = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local granted = math.max(0, math.min(tonumber(ARGV[2]), tonumber(ARGV[1]) - used))
if granted > 0 then redis.call('INCRBY', KEYS[1], granted) end
return granted
"""


def quota_key(name: str, version: int) -> str:
    """``N:quota:<v>``: how many groups were admitted under weight version ``version``."""
    return f"{name}:quota:{version}"


class SyncQuota:
    """The sync barrier of ``mode=sync``: at most ``per_version`` groups are admitted under
    each weight version, summed over every actor of the buffer (``N:quota:<v>``).

    Invariant: ``take_many(v, k)`` admits at most ``per_version`` groups per ``v`` job-wide,
    summed over all calls (``take`` is ``take_many(v, 1)``). It is not retried on a dropped
    connection: a retried take whose first reply was lost would count its groups twice and
    leave the version short of a full batch.
    """

    def __init__(self, buffer: BufferHandle, per_version: int) -> None:
        if per_version < 1:
            raise ValueError(f"per_version must be >= 1, got {per_version}")
        self.buffer, self.per_version = buffer, per_version
        self._script: Script | None = None

    def take(self, version: int) -> bool:
        """Admit one group under ``version`` if its quota is not used up."""
        return self.take_many(version, 1) == 1

    def take_many(self, version: int, count: int) -> int:
        """Admit up to ``count`` groups under ``version`` (one script, ``TAKE_QUOTA``: the
        counter holds exactly the groups admitted); returns how many."""
        script = self._script
        if script is None:
            script = self._script = self.buffer.client.register_script(TAKE_QUOTA)
        key = quota_key(self.buffer.name, version)
        return int(script([key], [self.per_version, count]))

    def reset(self, first: int, last: int) -> int:
        """Forget what was admitted under versions ``first..last`` (a learner restarting at
        ``first``: groups admitted before the restart whose actor stopped before committing
        them hold quota that nothing will fill, and the step at ``first`` would wait for them
        forever). Returns how many admissions were forgotten. Groups of those versions already
        committed and unread stay in the buffer: the restarted step may read more than a
        batch's worth of them, and the rest are dropped as stale, counted."""
        keys = [quota_key(self.buffer.name, v) for v in range(first, max(first, last) + 1)]
        client = self.buffer.client
        held = sum(int(x) for x in client.mget(keys) if x is not None)
        client.delete(*keys)
        return held

    def give_back(self, version: int, count: int) -> None:
        """Return ``count`` admissions of ``version`` that found no buffer slot."""
        if count > 0:
            self.buffer.client.decrby(quota_key(self.buffer.name, version), count)
