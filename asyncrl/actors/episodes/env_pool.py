"""Environments out of the actor's event loop: worker processes hosting many episodes each,
every call with a deadline, every failure ending its episode with a reason and a count.

    EnvPool.open(episode, row)        the least loaded worker (started if need be: "ready")
      |                               hosts the episode from now on (pinned)
      v
    open / step / tool / close  --JSON line-->  env_worker (its asyncio loop; sync methods
      |  await the reply, at most timeout_s     in threads; one episode's calls in order)
      |-- a reply                  -> the result
      |-- an error reply           -> EnvError(reason): the environment raised or answered
      |                               badly; the episode is closed and forgotten
      |-- timeout_s passed         -> EnvTimeout(where the call was); the episode is forgotten.
      |                               "abandon" asks the worker where the call is: no answer
      |                               within _PING_S = its loop is stuck -> killed (a crash)
      '-- the worker died          -> EnvCrashed(reason) for every episode it hosted; a new
                                      worker takes the slot at the next open (a restart)

Workers are processes (env_process.py: they die with the actor, however it dies, and a kill
takes what the environment started with them). A worker holding ``_RETIRE_STUCK`` abandoned calls
that never returned (threads that cannot be stopped) is retired: it takes no new episode,
and is killed when its last one leaves. ``shutdown()`` kills every worker and reaps it.

The same pool hosts agents (``module="asyncrl.actors.agents.agent_worker"``: ``begin(id)``
makes the episode's agent, ``call(id, "run", fields, "run")`` runs it), with the same
deadlines, failures and counts.

Invariant: an episode is open in at most one worker, and after any ``Env*`` exception from
one of its calls the pool has forgotten it: ``close`` of it is a no-op, other calls raise.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import time
from collections.abc import Sequence

from asyncrl.actors.episodes.env import StepResult
from asyncrl.actors.episodes.env_process import ENV_WORKER, EnvProcess, WorkerDied, worker_noun
from asyncrl.actors.episodes.tool_calls import ToolCall
from asyncrl.actors.episodes.tools import ToolResult
from asyncrl.core.runtime.fatal import FatalError

START_TIMEOUT_S = 120.0
"""Longest a worker may take to import the environment and its tools."""
_PING_S = 2.0  # a live worker answers "abandon" from its loop in ms; 2 s leaves room for load
_RETIRE_STUCK = 4  # abandoned calls still running in one worker before it is retired
_JOIN_S = 2.0  # shutdown(): the longest it waits for all killed workers to be reaped


class EnvTimeout(Exception):
    """An environment call overran ``timeout_s``; its episode is over (``env_timeout``)."""


class EnvError(Exception):
    """The environment raised, or returned what the checks refuse; its episode is over
    (``env_error``). ``traceback`` is the worker's, where there is one."""

    def __init__(self, reason: str, traceback: str = "") -> None:
        super().__init__(reason)
        self.traceback = traceback


class EnvCrashed(Exception):
    """The worker hosting the episode died or was stuck and killed (``env_error``)."""


class EnvWorkerError(FatalError):
    """A worker could not load the environment or its tools (a restart would not help)."""


@dataclasses.dataclass
class EnvCounters:
    """What the pool saw, for the actor to report (all monotonic)."""

    calls: int = 0
    """open, step, tool and close calls sent to a worker."""
    timeouts: int = 0
    """``EnvTimeout`` raised."""
    crashes: int = 0
    """Workers that died, or were stuck and killed (each counted once)."""
    errors: int = 0
    """``EnvError`` raised (the environment raised or answered badly)."""
    restarts: int = 0
    """Workers started in the slot of a crashed or retired one."""


class EnvPool:
    """``workers`` worker processes hosting the episodes of environment ``spec`` (a class,
    ``"module:Name"`` or ``"file.py:Name"``), each episode's tools being its own ``tools()``
    plus ``tool_specs`` (``"module:function"``); every call has the deadline ``timeout_s``;
    each episode's environment is ``spec(**env_kwargs)`` (JSON values). See the module
    docstring. Workers start when first needed (or all at ``start()``). ``module``: the worker
    process's module (``env_process.ENV_WORKER``, or one speaking its protocol: the agents').

    ``open``, ``begin``, ``step``, ``tool``, ``call`` and ``close`` raise ``EnvTimeout``, ``EnvError`` and
    ``EnvCrashed`` (the episode is over), ``EnvWorkerError`` (fatal: a worker cannot load the
    spec), ``TypeError`` for values that are not JSON and ``ValueError`` for an episode that is
    not open (or already is, for ``open``)."""

    def __init__(
        self,
        spec: str,
        tool_specs: Sequence[str] = (),
        workers: int = 1,
        timeout_s: float = 30.0,
        env_kwargs: dict | None = None,
        module: str = ENV_WORKER,
    ) -> None:
        if workers < 1 or not timeout_s > 0:
            raise ValueError(f"need workers >= 1 and timeout_s > 0, got {workers}, {timeout_s}")
        self.spec, self.tool_specs, self.timeout_s = spec, list(tool_specs), timeout_s
        self.env_kwargs = dict(env_kwargs or {})
        self.module, self.noun = module, worker_noun(module)
        self.counters = EnvCounters()
        self._slots: list[EnvProcess | None] = [None] * workers
        self._used = [False] * workers  # the slot had a worker before: a start is a restart
        self._others: set[EnvProcess] = set()  # retired ones still serving, and killed ones
        self._episodes: dict[str, EnvProcess] = {}
        self._lost: dict[str, str] = {}  # episodes of a crashed worker: why, until next asked
        self._ids = itertools.count()

    @property
    def pids(self) -> list[int]:
        """The process ids of the live workers (in slots or retired)."""
        workers = [w for w in self._slots if w is not None] + list(self._others)
        return [w.proc.pid for w in workers if w.alive]

    async def start(self) -> None:
        """Start every worker and wait until each loaded the spec (``EnvWorkerError`` if not)."""
        await asyncio.gather(*(self._started(self._worker(i)) for i in range(len(self._slots))))

    async def open(self, episode_id: str, row: dict) -> tuple[list[dict], list[dict]]:
        """Make the episode's environment and ``reset(row)`` it: its first messages and the
        schemas of its tools. On the least loaded worker, which hosts it until it ends."""
        reply = await self.begin(episode_id, {"row": row}, "reset")
        return reply["messages"], reply["tools"]

    async def begin(self, episode_id: str, fields: dict | None = None, what: str = "open") -> dict:
        """Pin the episode to the least loaded worker (started if need be), which hosts it
        until it ends, and send it ``open`` with ``fields``: the worker's reply. ``open`` of
        an environment is this; an agent's episode starts with it alone."""
        if episode_id in self._episodes:
            raise ValueError(f"episode {episode_id!r} is already open")
        self._lost.pop(episode_id, None)
        worker = self._worker(min(range(len(self._slots)), key=self._load))
        worker.episodes.add(episode_id)
        self._episodes[episode_id] = worker
        try:
            await self._started(worker)
        except BaseException:
            self._end(episode_id)
            raise
        return await self.call(episode_id, "open", fields or {}, what)

    async def step(self, episode_id: str, message: dict) -> StepResult:
        """The environment's ``step(message)``, checked (``env.check_step_result``)."""
        reply = await self.call(episode_id, "step", {"message": message}, "step")
        return StepResult(**reply["result"])

    async def tool(self, episode_id: str, call: ToolCall) -> ToolResult:
        """``call`` answered by the episode's tools; a tool's own failure is an answer
        (``ToolResult.error``), not an exception."""
        fields = {"call": {"name": call.name, "arguments": call.arguments}}
        reply = await self.call(episode_id, "tool", fields, f"tool {call.name}")
        return ToolResult(**reply["result"])

    async def close(self, episode_id: str) -> None:
        """The environment's ``close()``; the pool forgets the episode. A no-op for one it
        already forgot (after an ``Env*`` exception)."""
        if episode_id not in self._episodes:
            self._lost.pop(episode_id, None)
            return
        try:
            await self._send(episode_id, "close", {}, "close")
        finally:
            self._end(episode_id, send_close=False)

    async def shutdown(self) -> None:
        """Kill every worker (with what it started) and reap it, within ``_JOIN_S`` in all.
        Open episodes are lost (their next call raises ``EnvCrashed``); a later ``open``
        starts new workers. It never awaits, so a caller being cancelled cannot cut it short
        (the joins block the loop: killed processes are reaped in milliseconds)."""
        workers = [w for w in self._slots if w is not None] + list(self._others)
        for w in workers:
            w.kill()
        deadline = time.monotonic() + _JOIN_S
        for w in workers:
            w.join(max(0.0, deadline - time.monotonic()))
        for episode_id in self._episodes:
            self._lost[episode_id] = f"the {self.noun} pool was shut down"
        self._slots = [None] * len(self._slots)
        self._others, self._episodes = set(), {}

    async def call(self, episode_id: str, op: str, fields: dict, what: str) -> dict:
        """Send ``{"op": op, "episode": episode_id, **fields}`` to the episode's worker and
        return its reply, within ``timeout_s``; ``what`` names the call in errors (``"step"``,
        ``"run"``). Raises as the class docstring says; any exception (cancellation too) ends
        the episode: the pool forgets it and its worker closes it once the call returns."""
        try:
            return await self._send(episode_id, op, fields, what)
        except BaseException:
            self._end(episode_id)
            raise

    async def _send(self, episode_id: str, op: str, fields: dict, what: str) -> dict:
        """``call`` without ending the episode on a failure (``close`` ends it itself)."""
        worker = self._episodes.get(episode_id)
        if worker is None:
            if episode_id in self._lost:
                raise EnvCrashed(self._lost.pop(episode_id))
            raise ValueError(f"episode {episode_id!r} is not open (never opened, or it ended)")
        if not worker.alive:
            reason = worker.dead or f"the {self.noun} worker process is gone"
            self._crashed(worker, reason)
            raise EnvCrashed(self._lost.pop(episode_id, reason))
        call_id = next(self._ids)
        request = {"id": call_id, "op": op, "episode": episode_id, **fields}
        try:
            line = json.dumps(request).encode() + b"\n"
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"{what} of episode {episode_id!r}: {', '.join(fields)} must be JSON values for "
                f"the {self.noun}'s worker process ({e})"
            ) from None
        self.counters.calls += 1
        future = worker.send(call_id, line)
        try:
            reply = await asyncio.wait_for(asyncio.wrap_future(future), self.timeout_s)
        except asyncio.TimeoutError:
            worker.forget(call_id)
            self.counters.timeouts += 1
            where = await self._abandon(worker, call_id, episode_id)
            raise EnvTimeout(
                f"{what} of episode {episode_id!r} did not return within timeout_s="
                f"{self.timeout_s:g} s ({self.noun} {self.spec}); {where}"
            ) from None
        except WorkerDied as e:
            self._crashed(worker, str(e))
            raise EnvCrashed(self._lost.pop(episode_id, str(e))) from None
        except asyncio.CancelledError:
            worker.forget(call_id)
            raise
        if "error" in reply:
            self.counters.errors += 1
            raise EnvError(f"{what}: {reply['error']}", reply.get("traceback", ""))
        return reply

    async def _abandon(self, worker: EnvProcess, call_id: int, episode_id: str) -> str:
        """Tell the worker the call is given up; where it is now. A worker whose loop does not
        answer within ``_PING_S`` is stuck: its stacks are taken and it is killed."""
        ping_id = next(self._ids)
        line = json.dumps({"id": ping_id, "op": "abandon", "of": call_id}).encode() + b"\n"
        try:
            reply = await asyncio.wait_for(asyncio.wrap_future(worker.send(ping_id, line)), _PING_S)
        except asyncio.TimeoutError:
            worker.forget(ping_id)
            stacks = await worker.stacks()
            self._crashed(
                worker,
                f"the {self.noun} worker process (pid {worker.proc.pid}) was stuck: it did not "
                f"answer within {_PING_S:g} s after a call overran its deadline (an async "
                "method that blocks without awaiting?), so it was killed",
            )
            self._lost.pop(episode_id, None)  # this one ends as a timeout
            return f"its worker was stuck and was killed; its threads were:\n{stacks}"
        except WorkerDied as e:
            self._crashed(worker, str(e))
            self._lost.pop(episode_id, None)
            return f"then its worker died ({e})"
        if reply.get("stuck", 0) >= _RETIRE_STUCK:
            self._retire(worker)
        return f"where it was: {reply.get('where', '(unknown)')}"

    async def _started(self, worker: EnvProcess) -> None:
        """Wait until ``worker`` loaded the spec; ``EnvWorkerError`` (and it is killed) if not."""
        wait = asyncio.shield(asyncio.wrap_future(worker.ready))  # shared by concurrent opens
        tools = f" with tools {self.tool_specs}" if self.tool_specs else ""
        what = f"{self.noun} {self.spec}{tools}"
        try:
            reply = await asyncio.wait_for(wait, START_TIMEOUT_S)
        except asyncio.TimeoutError:
            self._drop(worker)
            raise EnvWorkerError(
                f"an {self.noun} worker process did not load {what} within "
                f"{START_TIMEOUT_S:g} s; check what importing them does"
            ) from None
        except WorkerDied as e:
            self._drop(worker)
            raise EnvWorkerError(
                f"an {self.noun} worker process for {what} exited before it was ready ({e}); "
                "its output is in the actor's log"
            ) from None
        if "error" in reply:
            self._drop(worker)
            raise EnvWorkerError(f"an {self.noun} worker process: {reply['error']}")

    def _worker(self, slot: int) -> EnvProcess:
        """The worker of ``slot``, started if it has none (or a dead one)."""
        worker = self._slots[slot]
        if worker is not None and not worker.alive:
            self._crashed(worker, worker.dead or f"the {self.noun} worker process is gone")
            worker = None
        if worker is None:
            self.counters.restarts += self._used[slot]
            self._used[slot] = True
            args = (self.spec, self.tool_specs, self.env_kwargs, self.module)
            worker = self._slots[slot] = EnvProcess(*args)
        return worker

    def _load(self, slot: int) -> int:
        worker = self._slots[slot]
        return len(worker.episodes) if worker is not None and worker.alive else 0

    def _end(self, episode_id: str, send_close: bool = True) -> None:
        """Forget the episode; the worker closes it (when its calls in flight returned)."""
        worker = self._episodes.pop(episode_id, None)
        if worker is None:
            return
        worker.episodes.discard(episode_id)
        if send_close and worker.alive:
            close_id = next(self._ids)
            request = {"id": close_id, "op": "close", "episode": episode_id}
            worker.send(close_id, json.dumps(request).encode() + b"\n")
            worker.forget(close_id)  # nobody waits for its reply
        if worker.retired and not worker.episodes:
            worker.kill()

    def _crashed(self, worker: EnvProcess, reason: str) -> None:
        """Kill ``worker`` (once) and fail every episode it hosted with ``reason``."""
        if worker.gone:  # killed by the pool already: counted then, or not a crash
            return
        self.counters.crashes += 1
        self._drop(worker)
        for episode_id in worker.episodes:
            self._episodes.pop(episode_id, None)
            self._lost[episode_id] = reason
        worker.episodes.clear()

    def _retire(self, worker: EnvProcess) -> None:
        worker.retired = True
        self._slots = [None if w is worker else w for w in self._slots]
        self._others.add(worker)
        if not worker.episodes:
            worker.kill()

    def _drop(self, worker: EnvProcess) -> None:
        worker.kill()
        self._slots = [None if w is worker else w for w in self._slots]
        self._others.add(worker)  # reaped by shutdown()
