"""Calling the reward function from an actor: off the event loop, with a deadline, errors
counted by kind, the first of each kind logged with its traceback, and the run failed when
too many recent rewards failed.

    make_group (event loop) --await--> RewardScorer.score
                                         |  one call at a time (an asyncio.Lock)
                                         v
                                       _Worker thread: rewards.score_call(fn, ...)
                                         |  a result; or task.reward_timeout_s passed: the
                                         |  call scores 0 as a 'timeout' error and its stuck
                                         |  thread is abandoned for a fresh one
                                         v
                                       ErrorWindow: more than task.max_reward_error_frac of
                                       the last task.reward_error_window rewards failed?
                                         -> RewardErrorRate (the actor exits non-zero)

Why a thread: a reward that blocks (sleeps, waits on a server, runs a sandbox) on the event
loop held up weight updates and Ctrl-C for as long as it ran. The worker is a daemon thread,
so a call stuck in user code never holds up a stop or the process's exit. Calls stay one at
a time, as they were on the loop, so a reward function need not be thread-safe. (A process
pool, which could also kill a stuck call, is a later issue; until then an abandoned call
keeps its thread until it returns.)

``RewardErrorTally`` is the learner's account (summary.json ``reward_errors``) of the reward
errors in the samples it trained, read from their ``Sample.reward_error``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable

from actors.rewards import RewardFn, Scored, error_kind, score_call
from asyncrl.fatal import FatalError


class RewardErrorRate(FatalError):
    """More than ``task.max_reward_error_frac`` of the recent rewards failed (a restarted
    actor would call the same function: the launcher does not restart it)."""


class ErrorWindow:
    """Whether more than ``frac`` of the last ``size`` rewards failed.

    Invariant: ``add`` returns True iff the errors among the last ``size`` results number
    more than ``frac * size``. Until ``size`` results were seen the missing ones count as
    successes, so it takes more than ``frac * size`` errors to trip, and ``frac = 1.0``
    never trips.
    """

    def __init__(self, frac: float, size: int) -> None:
        if not 0.0 <= frac <= 1.0 or size < 1:
            raise ValueError(f"need 0 <= frac <= 1 and size >= 1, got frac={frac}, size={size}")
        self.frac, self.size = frac, size
        self._last: deque[bool] = deque(maxlen=size)
        self.errors = 0
        """Errors among the last ``size`` results."""

    def add(self, failed: bool) -> bool:
        if len(self._last) == self.size:
            self.errors -= self._last[0]
        self._last.append(failed)
        self.errors += failed
        return self.errors > self.frac * self.size


class RewardErrorTally:
    """Reward errors over some samples: ``{"count", "samples", "by_kind", "first"}``, where
    ``first`` is ``{"kind", "reason", "group_id"}`` of the first error (null if none)."""

    def __init__(self, saved: dict | None = None) -> None:
        saved = saved or {}
        self.count = int(saved.get("count", 0))
        self.samples = int(saved.get("samples", 0))
        self.by_kind: dict[str, int] = dict(saved.get("by_kind", {}))
        self.first: dict | None = saved.get("first")

    def add(self, reason: str, group_id: str = "") -> None:
        """One sample's ``reward_error`` ("" = scored fine)."""
        self.samples += 1
        if not reason:
            return
        kind = error_kind(reason)
        self.count += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        if self.first is None:
            self.first = {"kind": kind, "reason": reason, "group_id": group_id}

    def to_dict(self) -> dict:
        return {
            "count": self.count,
            "samples": self.samples,
            "by_kind": dict(sorted(self.by_kind.items())),
            "first": self.first,
        }


class RewardScorer:
    """``await score(prompt, completion, fields)``: see the module docstring.

    ``task`` is the ``TaskConfig`` (its ``reward_fn`` spec, ``reward_timeout_s``,
    ``max_reward_error_frac``, ``reward_error_window``); ``say`` prints one line to the
    actor's log (the launcher echoes lines that start with ``[actor``); ``count(kind)`` is
    called for every failed call (before a ``RewardErrorRate`` it may cause).
    """

    def __init__(
        self,
        fn: RewardFn,
        task,
        say: Callable[[str], None],
        count: Callable[[str], None] = lambda kind: None,
    ) -> None:
        self.fn, self.task, self.say, self.count = fn, task, say, count
        self.window = ErrorWindow(task.max_reward_error_frac, task.reward_error_window)
        self.first: dict[str, Scored] = {}
        """The first error of each kind, in the order they happened."""
        self.failed: RewardErrorRate | None = None
        """Set once the error rate tripped: no more calls (the actor is failing)."""
        self._lock = asyncio.Lock()
        self._worker = _Worker()

    async def score(self, prompt: str, completion: str, fields: dict | None = None) -> Scored:
        """The reward; a failed call scores 0 with its reason. Raises ``RewardErrorRate``
        once too many recent calls failed, and ``SandboxError`` (see ``score_call``)."""
        async with self._lock:  # one call at a time; the deadline counts the call alone
            if self.failed:  # calls queued behind the one that tripped it
                raise self.failed
            scored = await self._call(prompt, completion, fields or {})
        if scored.kind:
            self.count(scored.kind)
        if scored.kind and scored.kind not in self.first:
            self.first[scored.kind] = scored
            self._log_first(scored, prompt)
        if self.window.add(bool(scored.kind)):
            self.failed = RewardErrorRate(self._rate_message())
            raise self.failed
        return scored

    async def _call(self, prompt: str, completion: str, fields: dict) -> Scored:
        future = self._worker.submit(lambda: score_call(self.fn, prompt, completion, fields))
        timeout = self.task.reward_timeout_s
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except asyncio.TimeoutError:
            message = f"the call took longer than task.reward_timeout_s={timeout:g} s"
            stack = self._worker.stack()
            return Scored(0.0, "timeout", f"timeout: {message}", f"where it was:\n{stack}")
        finally:
            if not future.done():  # timed out, or the group was cancelled (a stop)
                self._worker.abandon()
                self._worker = _Worker()

    def _log_first(self, scored: Scored, prompt: str) -> None:
        self.say(
            f"reward error ({scored.kind}) from task.reward_fn={self.task.reward_fn} on prompt "
            f"{prompt[:80]!r}: {scored.reason}; the sample scores 0. Later {scored.kind} "
            "errors are counted (actor<i>.json, summary.json reward_errors), not logged"
        )
        for line in scored.detail.rstrip().splitlines():
            self.say(f"| {line}")

    def _rate_message(self) -> str:
        t, w = self.task, self.window
        first = next(iter(self.first.values()))
        return (
            f"reward function task.reward_fn={t.reward_fn} failed on {w.errors} of the last "
            f"{w.size} rewards ({w.errors / w.size:.0%}, more than task.max_reward_error_frac="
            f"{t.max_reward_error_frac:g} of task.reward_error_window={w.size}); first error: "
            f"{first.reason}. Fix the reward function, or raise "
            "task.max_reward_error_frac (1.0 = never fail on reward errors)"
        )


class _Worker:
    """One daemon thread running submitted calls in order; ``abandon`` lets it leave once
    the call it is stuck in returns (a daemon: it never holds up the process's exit)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="reward", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Scored]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((fn, future))
        return future

    def abandon(self) -> None:
        self._jobs.put(None)

    def stack(self) -> str:
        """Where the thread is now (the user code a timed-out call is stuck in)."""
        frame = sys._current_frames().get(self._thread.ident)
        return "".join(traceback.format_stack(frame)) if frame is not None else "(unknown)\n"

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as e:  # SandboxError: re-raised in the awaiting task
                future.set_exception(e)
