"""Calling the reward function from an actor: off the event loop, several calls at once,
each with a deadline, errors counted by kind, the first of each kind logged with its
traceback, and the run failed when too many recent rewards failed.

    make_group (event loop) --await--> RewardScorer.score_all(prompt, n completions)
                                         |  the n calls at once, results in sample order
                                         v
                                       RewardPool (actors/rewards/pool.py): at most
                                       task.reward_workers calls at once, in worker
                                       processes (task.reward_executor=process) or threads;
                                         |  a result; or task.reward_timeout_s passed: the
                                         |  call scores 0 as a 'timeout' error and its worker
                                         |  is killed (a process) or abandoned (a thread);
                                         |  a worker process that died: a 'crashed' error
                                         v
                                       ErrorWindow: more than task.max_reward_error_frac of
                                       the last task.reward_error_window rewards failed?
                                         -> RewardErrorRate (the actor exits non-zero)

Why off the loop: a reward that blocks (sleeps, waits on a server, runs a sandbox) on the
event loop held up weight updates and Ctrl-C for as long as it ran. Why several at once: a
group's n rewards one after another cost n times one call per group (8 x 50 ms = 0.4 s), and
with one call at a time for all groups in flight a slow reward throttled generation
(benchmarks/parts/reward_pool.py measures it). Which executor, and why processes by default: see
``TaskConfig.reward_executor`` in asyncrl/core/config/job.py.

The kinds, and the learner's tally of them (``RewardErrorTally``), are in
asyncrl/learner/hub/reward_records.py: core, read by both roles.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from asyncrl.actors.rewards.calls import Scored
from asyncrl.actors.rewards.loading import RewardFn
from asyncrl.actors.rewards.pool import make_pool
from asyncrl.core.runtime.error_window import ErrorWindow
from asyncrl.core.runtime.fatal import FatalError


class RewardErrorRate(FatalError):
    """More than ``task.max_reward_error_frac`` of the recent rewards failed (a restarted
    actor would call the same function: the launcher does not restart it)."""


class RewardScorer:
    """``await score(prompt, completion, fields)`` / ``score_all``: see the module docstring.

    ``fn`` is the loaded reward function (called by thread workers; process workers load
    ``task.reward_fn`` themselves). ``task`` is the ``TaskConfig`` (its ``reward_fn`` spec,
    ``reward_executor``, ``reward_workers``, ``reward_timeout_s``, ``max_reward_error_frac``,
    ``reward_error_window``); ``say`` prints one line to the actor's log (the launcher echoes
    lines that start with ``[actor``); ``count(kind)`` is called for every failed call
    (before a ``RewardErrorRate`` it may cause). ``close()`` stops the workers.
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
        self.pool = make_pool(fn, task)

    async def score_all(self, prompt: str, completions: list[str], fields: dict) -> list[Scored]:
        """``score`` of each completion, run at once through the pool; results in order. The
        first exception cancels the other calls and is raised."""
        calls = [asyncio.ensure_future(self.score(prompt, c, fields)) for c in completions]
        try:
            return list(await asyncio.gather(*calls))
        finally:
            for call in calls:  # after a failure (or a stop) the rest are of no use
                call.cancel()

    async def score(self, prompt: str, completion: str, fields: dict | None = None) -> Scored:
        """The reward; a failed call scores 0 with its reason. Raises ``RewardErrorRate``
        once too many recent calls failed, ``SandboxError`` (see ``score_call``) and
        ``RewardWorkerError`` (a worker process cannot load the function)."""
        if self.failed:  # calls queued behind the one that tripped it
            raise self.failed
        scored = await self.pool.call(prompt, completion, fields or {})
        if self.failed:  # it tripped while this call ran: this one is not counted
            raise self.failed
        if scored.kind:
            self.count(scored.kind)
        if scored.kind and scored.kind not in self.first:
            self.first[scored.kind] = scored
            self._log_first(scored, prompt)
        if self.window.add(bool(scored.kind), scored.kind):
            self.failed = RewardErrorRate(self._rate_message())
            raise self.failed
        return scored

    def close(self) -> None:
        """Stop the workers (a process worker is killed, with what it started)."""
        self.pool.close()

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
        if w.fast:
            return (
                f"reward function task.reward_fn={t.reward_fn} failed on each of the first "
                f"{w.first} rewards, all the same way ({first.kind}): {first.reason}. Fix the "
                "reward function (a timeout: make it faster or raise task.reward_timeout_s), "
                "or set task.max_reward_error_frac=1.0 to never fail on reward errors"
            )
        return (
            f"reward function task.reward_fn={t.reward_fn} failed on {w.errors} of the last "
            f"{w.size} rewards ({w.errors / w.size:.0%}, more than task.max_reward_error_frac="
            f"{t.max_reward_error_frac:g} of task.reward_error_window={w.size}); first error: "
            f"{first.reason}. Fix the reward function, or raise "
            "task.max_reward_error_frac (1.0 = never fail on reward errors)"
        )
