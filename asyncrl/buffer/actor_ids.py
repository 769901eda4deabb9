"""Actor ids claimed in the buffer, so launches on many hosts never share one.

A job has ``actor.total`` actors (``num_actors`` per ``asyncrl launch actors``, ``nnodes``
launches). Each id owns a prompt cursor (buffer/cursors.py), so two live actors with one id
would break exactly-once. Each launch claims ``num_actors`` ids::

    <buffer>:actor_id:<i>        = launch token, with a time-to-live (PX) the launch keeps renewing
    <buffer>:actor_id_last:<i>   = the last token that claimed id i (no time-to-live)

Invariants:

- An id is held by at most one token at a time (claim and renew are Lua scripts, atomic).
- A launch claims its own ids back first: its token lives in its run directory
  (``actor_ids.token``, mode 0600), so a relaunch on the same run directory resumes the same
  cursors at once. Then the free ids it held last (``actor_id_last``), so after an outage
  longer than ``ttl_s`` (a requeued Slurm job waiting to start again) launches that start
  together in any order still get their own ids back; then any free id.
- The ids of a launch that died come free after ``ttl_s`` without renewal; another launch
  may then take them and resumes their cursors (nothing is lost: a cursor's in-flight
  prompts are re-claimed by whoever holds the id). A launch that stops cleanly releases its
  ids at once, only those still held by its token.
- A launch whose id was taken by another (it was cut off longer than ``ttl_s``) learns it at
  its next renewal and must stop its actors (``lost`` is non-empty).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, cast

from asyncrl.core.runtime.rundir import write_atomic

if TYPE_CHECKING:
    import redis

# KEYS: the slot key of every id 0..n-1, then its last-holder key.  ARGV: token, count, ttl_ms.
# Keeps (and refreshes) the ids this token holds, up to count, then takes free ones (missing
# or released ""): first those this token held last, then any; releases held ids beyond
# count. Returns the ids held, ascending.
_CLAIM = """
local token, count, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local n = #KEYS / 2
local held = {}
local function take(i)
  redis.call('SET', KEYS[i], token, 'PX', ttl)
  redis.call('SET', KEYS[n + i], token)
  table.insert(held, i - 1)
end
for i = 1, n do
  if redis.call('GET', KEYS[i]) == token then
    if #held < count then take(i) else redis.call('SET', KEYS[i], '', 'PX', 1) end
  end
end
for pass = 1, 2 do
  for i = 1, n do
    if #held >= count then break end
    local v = redis.call('GET', KEYS[i])
    if (v == false or v == '') and (pass == 2 or redis.call('GET', KEYS[n + i]) == token) then
      take(i)
    end
  end
end
table.sort(held)
return held
"""

# KEYS: the slot keys of the ids to renew.  ARGV: token, ttl_ms.
# Refreshes each id held by this token or free (expired during a partition: take it back);
# returns the positions (1-based) of ids another token holds now.
_RENEW = """
local lost = {}
for i, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  if v == ARGV[1] or v == false or v == '' then
    redis.call('SET', key, ARGV[1], 'PX', tonumber(ARGV[2]))
  else
    table.insert(lost, i)
  end
end
return lost
"""

# KEYS: the slot keys of the ids to release.  ARGV: token.
# Frees each id still held by this token (one another launch took stays its) as _CLAIM does
# (the actor ACL user may not DEL); returns the positions (1-based) of the ids freed.
_RELEASE = """
local freed = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('SET', key, '', 'PX', 1)
    table.insert(freed, i)
  end
end
return freed
"""


class ActorIds:
    """Claims of ids ``0 .. total-1`` in buffer ``name`` for one launch (``token``)."""

    def __init__(
        self, client: redis.Redis, name: str, total: int, token: str, ttl_s: float
    ) -> None:
        if total < 1:
            raise ValueError(f"total must be >= 1, got {total}")
        self.client, self.name, self.total, self.token = client, name, total, token
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self._claim = client.register_script(_CLAIM)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    def _key(self, i: int) -> str:
        return f"{self.name}:actor_id:{i}"

    def _last_key(self, i: int) -> str:
        return f"{self.name}:actor_id_last:{i}"

    def claim(self, count: int) -> list[int]:
        """Up to ``count`` ids for this token: the ones it holds, then free ones it held last,
        then other free ones."""
        keys = [self._key(i) for i in range(self.total)]
        keys += [self._last_key(i) for i in range(self.total)]
        return [int(i) for i in self._claim(keys, [self.token, count, self.ttl_ms])]

    def renew(self, ids: list[int]) -> list[int]:
        """Extend this token's hold on ``ids``; returns the ids another launch holds now."""
        lost = self._renew([self._key(i) for i in ids], [self.token, self.ttl_ms])
        return [ids[int(pos) - 1] for pos in lost]

    def release(self, ids: list[int]) -> list[int]:
        """Free those of ``ids`` this token still holds, so a relaunch elsewhere need not
        wait out the TTL; returns the ids freed."""
        freed = self._release([self._key(i) for i in ids], [self.token])
        return [ids[int(pos) - 1] for pos in freed]

    def holders(self) -> dict[int, str]:
        """id -> token of every held id (for messages and tests)."""
        keys = [self._key(i) for i in range(self.total)]
        values = cast("list[bytes | None]", self.client.mget(keys))  # a bytes client (no decode)
        return {i: v.decode() for i, v in enumerate(values) if v}


def launch_token(run_dir: str | os.PathLike) -> str:
    """This launch's token: read from ``<run_dir>/actor_ids.token``, or made and written
    there (mode 0600) the first time, so a relaunch on the same run directory gets it back."""
    path = Path(run_dir) / "actor_ids.token"
    try:
        text = path.read_text().strip()
        if text:
            return text
    except FileNotFoundError:
        pass
    token = secrets.token_hex(16)
    write_atomic(path, token + "\n")  # a crash never leaves a part of a token
    return token
