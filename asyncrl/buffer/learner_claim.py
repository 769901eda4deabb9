"""One buffer, one learner: the learner's claim on a buffer, held in Redis with a lease.

Formerly, a second ``asyncrl launch learner`` on a buffer another learner was training from
was accepted. It took the first one's pending groups, reset the shared ``learner_version``
and trained the other policy's groups. Now each learner claims ``<buffer.name>:learner``
before it reads anything:

- the key holds JSON ``{"token", "host", "pid", "run_dir", "started"}`` and expires after
  ``ttl_s`` unless renewed; the holder renews it every ``ttl_s / 3`` from a thread;
- a free key (never claimed, or the holder died and its lease ran out) is taken;
- a key held for the **same run_dir** is taken over at once: that is the run restarting (a
  restarted rank, a resume; two live learners of one run_dir are refused earlier, by the run
  directory's lock);
- a key held by another run is refused at once with ``ClaimRefused``, naming the holder and
  when its lease ends.

Renewal and release are compare-and-set on the token (Lua scripts), so a learner never
extends or deletes a claim that was taken over. Each successful ``acquire`` increments
``<buffer.name>:learner_epoch`` and remembers the value. A renewal that finds the key **gone**
takes it back at once if the epoch is still its own: the lease lapsed because nothing could
renew it for ``ttl_s`` (Redis or this learner stopped for a while, a partition) and no other
learner took the buffer meanwhile, so this learner still owns it and trains on (formerly such a
stall of 30 s ended the run early with exit 0). A renewal that finds **another token's**
claim, or the key gone with a newer epoch (another learner held the buffer meanwhile and let
go), calls ``lost(why, same_run)`` once with the holder named: the learner must fail, never
finish as if done (hub.py: a ``FatalError``; ``same_run`` when a restarted learner of this
same run_dir took over, which stops this stalled one without a fatal record).
``release`` stops the renewals and waits for one in flight before it deletes the claim, so a
late renewal cannot put a finished run's claim back.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis

DEFAULT_TTL_S = 30.0

# KEYS: the claim key, the epoch key.  ARGV: token, ttl_ms, this learner's JSON, its epoch.
# Returns 1 renewed, 2 taken back (the key had lapsed, the epoch is still ours), -1 another
# token holds it, -2 the key lapsed and another learner held the buffer since (newer epoch).
_RENEW = """
local v = redis.call('GET', KEYS[1])
if not v then
  if redis.call('GET', KEYS[2]) ~= ARGV[4] then return -2 end
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[2])
  return 2
end
if cjson.decode(v)['token'] ~= ARGV[1] then return -1 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
RENEWED, TAKEN_BACK, TAKEN, HELD_MEANWHILE = 1, 2, -1, -2
_RELEASE = """
local v = redis.call('GET', KEYS[1])
if v and cjson.decode(v)['token'] == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class ClaimRefused(RuntimeError):
    """Another run's learner holds the buffer."""


def claim_key(buffer_name: str) -> str:
    return f"{buffer_name}:learner"


def epoch_key(buffer_name: str) -> str:
    return f"{buffer_name}:learner_epoch"


class LearnerClaim:
    """This learner's claim on buffer ``name`` (see the module docstring)."""

    def __init__(
        self, client: redis.Redis, name: str, run_dir: str, ttl_s: float = DEFAULT_TTL_S
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.client, self.name, self.ttl_s = client, name, ttl_s
        self.key, self.epoch_key = claim_key(name), epoch_key(name)
        self.run_dir = os.path.realpath(run_dir)
        self.token = secrets.token_hex(8)
        self.epoch = 0
        """The epoch this learner's ``acquire`` got (0 before)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.strftime("%Y-%m-%d %H:%M:%S")

    @property
    def _me(self) -> str:
        return json.dumps(
            {
                "token": self.token,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "run_dir": self.run_dir,
                "started": self._started,
                "epoch": self.epoch,
            }
        )

    def acquire(self, say: Callable[[str], None] = print) -> None:
        """Take the claim, or raise ``ClaimRefused`` naming the holder (module docstring)."""
        ttl_ms = int(self.ttl_s * 1000)
        for _ in range(3):  # the holder's key may expire between our SET and GET
            if self.client.set(self.key, self._me, nx=True, px=ttl_ms):
                return self._new_epoch(ttl_ms)
            raw, left = self.client.get(self.key), self.client.pttl(self.key)
            if raw is None:
                continue
            holder = json.loads(raw)
            if holder.get("run_dir") == self.run_dir:
                self.client.set(self.key, self._me, px=ttl_ms)
                say(
                    f"took over the claim on buffer {self.name!r} from an earlier learner of "
                    f"this run (pid {holder.get('pid')} on {holder.get('host')})"
                )
                return self._new_epoch(ttl_ms)
            raise ClaimRefused(refusal(self.name, holder, left / 1000 if left > 0 else None))
        raise ClaimRefused(f"buffer {self.name!r}: could not claim it (it changed hands 3 times)")

    def _new_epoch(self, ttl_ms: int) -> None:
        """Count this holding (the key is ours: nobody else increments meanwhile)."""
        self.epoch = int(self.client.incr(self.epoch_key))
        self.client.set(self.key, self._me, px=ttl_ms, xx=True)

    def renew(self) -> int:
        """Extend the lease: ``RENEWED``, ``TAKEN_BACK`` (it had lapsed and no other learner
        held it since: now ours again), ``TAKEN`` (another learner holds it) or
        ``HELD_MEANWHILE`` (it lapsed, and another learner held it since)."""
        ttl_ms = int(self.ttl_s * 1000)
        keys = (self.key, self.epoch_key)
        return int(self.client.eval(_RENEW, 2, *keys, self.token, ttl_ms, self._me, self.epoch))

    def holder(self) -> dict:
        """The claim's holder as stored (``{}`` when the key is gone)."""
        raw = self.client.get(self.key)
        return json.loads(raw) if raw else {}

    def keep(self, lost: Callable[[str, bool], None], say: Callable[[str], None] = print) -> None:
        """Renew every ``ttl_s / 3`` in a daemon thread until ``release``: a lapsed claim is
        taken back (``say`` tells); one another learner took, or held meanwhile, calls
        ``lost(why, same_run)`` once, naming it (a Redis error is retried next time)."""

        def loop() -> None:
            while not self._stop.wait(self.ttl_s / 3):
                try:
                    status = self.renew()
                    if status == TAKEN_BACK:
                        say(lapsed(self.name, self.ttl_s))
                    elif status in (TAKEN, HELD_MEANWHILE):
                        holder = self.holder()
                        same = status == TAKEN and holder.get("run_dir") == self.run_dir
                        why = taken(self.name, holder) if status == TAKEN else meanwhile(self.name)
                        lost(superseded(self.name, holder) if same else why, same)
                        return
                except Exception:  # Redis away for a moment: the reads will say so
                    continue

        self._thread = threading.Thread(target=loop, name="learner-claim", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop renewing, wait (5 s at most) for a renewal in flight, then delete the claim if
        it is still ours (best effort)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        try:
            self.client.eval(_RELEASE, 1, self.key, self.token)
        except Exception:  # Redis gone at shutdown: the lease runs out by itself
            pass


def refusal(name: str, holder: dict, left_s: float | None) -> str:
    """The message for a learner refused by ``holder`` (pure)."""
    lease = f"its lease ends in {left_s:.0f} s unless renewed" if left_s else "no expiry"
    return (
        f"buffer {name!r} already has a learner: pid {holder.get('pid')} on "
        f"{holder.get('host')}, run_dir {holder.get('run_dir')}, started {holder.get('started')} "
        f"({lease}). One buffer has one learner at a time: stop that learner, or give this one "
        "its own buffer.name (and actors); restarting that run's learner with the same run_dir "
        "takes the claim over"
    )


def lapsed(name: str, ttl_s: float) -> str:
    """What a learner says when it took its lapsed claim back (pure)."""
    return (
        f"the claim on buffer {name!r} had lapsed (nothing renewed it for {ttl_s:g} s: Redis "
        "or this learner was stalled or cut off) and no other learner took it: taken back, "
        "training goes on"
    )


def taken(name: str, holder: dict) -> str:
    """The failure of a learner whose claim another learner took while it was stalled (pure)."""
    return (
        f"the claim on buffer {name!r} was taken by another learner while this one could not "
        f"renew it: pid {holder.get('pid')} on {holder.get('host')}, run_dir "
        f"{holder.get('run_dir')}, started {holder.get('started')}. Two learners must not "
        "train from one buffer: this learner stops with an error (its checkpoints are kept). "
        "Stop the other learner and resume this run, or give each its own buffer.name"
    )


def meanwhile(name: str) -> str:
    """The failure of a learner whose lapsed claim another learner held, and let go, while it
    was stalled (pure)."""
    return (
        f"the claim on buffer {name!r} lapsed while this learner could not renew it, and "
        "another learner held the buffer since (it has let go again): two learners trained "
        "from one buffer, so this learner stops with an error (its checkpoints are kept). "
        "Check which learners run on this buffer.name, then resume this run alone"
    )


def superseded(name: str, holder: dict) -> str:
    """What a stalled learner says when a restarted learner of its own run took the claim
    (pure): it stops, and the new one goes on."""
    return (
        f"a restarted learner of this run (pid {holder.get('pid')} on {holder.get('host')}) "
        f"took the claim on buffer {name!r} while this one was stalled: this one stops, the "
        "new one trains on"
    )
