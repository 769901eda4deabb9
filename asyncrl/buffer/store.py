"""One replay buffer's state in Redis, and the plumbing every part of the buffer goes through.

``BufferStore`` holds what the buffer's two sides share (buffer/redis_buffer.py, the actors'
leases and commits and the shared state; buffer/stream_reads.py, the learner's reads):

- the key names (``keys``: ``<name>`` the stream, ``<name>:<part>`` the rest) and the Lua
  scripts (buffer/scripts.py), registered once;
- ``call``: a Redis call retried across dropped connections (``call_with_retries``);
  ``run``: a script through ``retrying``, which also rebuilds a consumer group destroyed from
  outside and turns a reply that says the state is damaged into ``BufferDamaged``;
- the single consumer group's lifecycle (``ensure_group``, ``regroup``, ``repairs``);
- the wake list that a freed slot pushes a token to (``wake``).

Every method is a bounded number of round trips; none holds state between calls besides the
consumer group's readiness and the repair log.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

import redis

from asyncrl.buffer import scripts
from asyncrl.buffer.connection import call_with_retries, describe
from asyncrl.core.runtime.fatal import FatalError

log = logging.getLogger(
    "asyncrl.buffer.redis_buffer"
)  # one logger for the buffer, as before the split

_SCRIPTS = (
    "LEASE",
    "COMMIT",
    "RENEW",
    "ACK",
    "DEAD_LETTER",
    "STATS",
    "DELIVERED",
    "REGROUP",
    "WANTS",
)
# Redis errors that mean the buffer's keys hold something the scripts did not write
_DAMAGE_ERRORS = ("BUFFERSTATE", "NOGROUP", "WRONGTYPE", "not an integer", "not a valid float")
_SCRIPT_SUFFIX = re.compile(r"\s*script: \w+, on @user_script:\d+\.?$")
_PARTS = ("dead", "leases", "stats", "meta", "group_ids", "commits", "wake")


class BufferDamaged(FatalError):
    """The buffer's own state in Redis is missing or was changed from outside the job
    (FLUSHDB, DEL, a hand-edited field). The message names the key and the fix. A restart of
    the role cannot fix it (asyncrl/core/runtime/fatal.py): the job's counts and queue are gone or wrong."""


class BufferStore:
    """``name``'s keys on ``client`` (bytes replies), read and written through retries."""

    def __init__(
        self,
        client: redis.Redis,
        name: str,
        consumer_group: str,
        capacity: int,
        reconnect_s: float,
        stop: Callable[[], bool],
    ) -> None:
        self.client, self.name, self.consumer_group = client, name, consumer_group
        self.capacity, self.reconnect_s, self.stop = capacity, reconnect_s, stop
        self.where = describe(client)
        self.keys = {part: f"{name}:{part}" for part in _PARTS} | {"stream": name}
        self.scripts = {n: client.register_script(getattr(scripts, n)) for n in _SCRIPTS}
        self.group_ready = False
        self.repairs: list[str] = []
        """One line per repair of damage from outside (a rebuilt consumer group)."""

    # -- calls -------------------------------------------------------------------------------

    def call(self, fn, on_retry=None):
        """``fn()`` retried while the connection is down, up to ``reconnect_s``."""
        return call_with_retries(fn, self.where, self.reconnect_s, on_retry, self.stop)

    def run(self, script: str, keys: list[str], args: list, on_retry=None):
        """Run one of ``buffer/scripts.py`` through ``retrying``."""
        return self.retrying(lambda: self.scripts[script](keys, args), keys, on_retry)

    def retrying(self, fn, keys: list[str], on_retry=None, consumer: str = ""):
        """``fn()`` with retries on dropped connections (``call``). A consumer group that
        vanished (NOGROUP) is rebuilt once (``regroup``) and ``fn`` run again; a reply that
        says the buffer's state is damaged raises ``BufferDamaged`` naming ``keys``."""
        for attempt in range(2):
            try:
                return self.call(fn, on_retry)
            except redis.ResponseError as e:
                text = _SCRIPT_SUFFIX.sub("", str(e))
                if "user executing the script can't run" in text:  # ACL, as outside a script
                    raise redis.exceptions.NoPermissionError(
                        f"{text} (on {', '.join(keys)})"
                    ) from None
                if not any(m in text for m in _DAMAGE_ERRORS):
                    raise
                regroup = attempt == 0 and self.group_ready and text.startswith("NOGROUP")
                if not regroup:
                    what = text.removeprefix("BUFFERSTATE ")
                    if what == text:  # a Redis error, not one of our scripts' reports
                        what = f"{text} (on {', '.join(keys)})"
                    raise self.damaged(what) from None
            self.regroup(consumer)  # outside the except: its errors are not "during" NOGROUP
        raise AssertionError("unreachable: the second attempt returns or raises")

    def damaged(self, what: str) -> BufferDamaged:
        return BufferDamaged(
            f"buffer state damaged: {what}. The buffer {self.name!r} was flushed (FLUSHDB) or "
            "its keys deleted or edited from outside the job, so its counts and queued groups "
            f"can no longer be trusted. Keep other clients off the keys {self.name} and "
            f"{self.name}:*, and restart the job with a fresh buffer (a new buffer.name): the "
            "learner resumes from its last checkpoint in the run directory"
        )

    def as_int(self, key: str, field: str, value: bytes) -> int:
        """``value`` of ``key``'s ``field`` as an int; ``BufferDamaged`` if it is not one."""
        try:
            return int(value)
        except ValueError:
            raise self.damaged(
                f"{key} field {field} is {as_text(value)!r}, not an integer"
            ) from None

    # -- the consumer group ------------------------------------------------------------------

    def ensure_group(self) -> None:
        """Register this buffer's single consumer group and create it (MKSTREAM) once; a
        group destroyed while no learner held it is rebuilt (``regroup``)."""
        if self.group_ready:
            return
        meta, group = self.keys["meta"], self.consumer_group
        self.retrying(lambda: self.client.hsetnx(meta, "consumer_group", group), [meta])
        owner = as_text(self.retrying(lambda: self.client.hget(meta, "consumer_group"), [meta]))
        if owner != group:
            raise ValueError(
                f"buffer {self.name!r} is consumed by group {owner!r}, not {group!r}: one "
                "learner job per buffer name (use a new buffer name for a new job)"
            )
        self.regroup("")

    def regroup(self, consumer: str) -> None:
        """Create the consumer group, or rebuild it where it was if it was destroyed from
        outside (``scripts.REGROUP``): the groups delivered before stay pending (their acks
        still count), none is read again as new. ``BufferDamaged`` if the stream or the meta
        is gone too (a FLUSHDB): then nothing says which groups were delivered."""
        keys = [self.keys["stream"], self.keys["meta"]]
        args = [self.consumer_group, consumer, "1" if self.group_ready else "0"]
        reply = self.run("REGROUP", keys, args)
        self.group_ready = True
        if as_text(reply[0]) != "repaired":
            return
        upto, n = as_text(reply[1]), int(reply[2])
        text = (
            f"buffer {self.name}: consumer group {self.consumer_group!r} of stream {self.name!r} "
            f"was missing (destroyed from outside the job, e.g. XGROUP DESTROY); rebuilt it at "
            f"the last delivered entry {upto} with the {n} group(s) delivered and not yet "
            "acked pending again (their delivery counts restart at 1), so none is read again "
            "as new and their acks still count"
        )
        log.warning(text)
        self.repairs.append(text)

    # -- the wake list -----------------------------------------------------------------------

    def wake(self, slots: int) -> None:
        """Tell up to ``slots`` actors waiting in ``lease`` that slots were freed; the list is
        trimmed to ``capacity`` tokens (a stale token only costs a waiter one more LEASE)."""
        if slots <= 0:
            return
        wake = self.keys["wake"]

        def push():
            pipe = self.client.pipeline(transaction=False)
            pipe.rpush(wake, *([b"1"] * min(slots, self.capacity)))
            pipe.ltrim(wake, -self.capacity, -1)
            pipe.execute()

        self.retrying(push, [wake])


def as_text(value: bytes | str) -> str:
    """A Redis reply (bytes) as text; undecodable bytes replaced."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value
