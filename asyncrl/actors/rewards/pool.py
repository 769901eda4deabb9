"""Reward worker pools: up to ``size`` reward calls at once, off the event loop, each with a
deadline (``task.reward_workers``, ``task.reward_executor``, ``task.reward_timeout_s``).

    RewardPool.call(prompt, completion, fields)              (event loop)
      | wait for a free slot (at most ``size`` calls run at once)
      | the slot has no worker, or its worker died: start one (a process: wait for "ready")
      v
    worker.submit(...) -> concurrent Future --await, at most timeout_s--> Scored
      | timed out:  Scored(0, "timeout", ..., where the call was); the worker is stopped
      | (a process: SIGKILL; a thread: abandoned) and the slot starts a fresh one next time
      | the process died (a crash, os._exit, the OOM killer): Scored(0, "crashed", ...)
      | cancelled (the actor stops): the worker is stopped, CancelledError goes on

Two kinds of worker, one interface (``started``, ``submit``, ``where``, ``stop``, ``join``,
``alive``):

- ``ThreadWorker``: a daemon thread in the actor calling the function. A stuck call cannot
  be stopped: its thread is abandoned and leaves when the call returns (a daemon, it holds up
  no exit), so a reward that always hangs leaves one thread per timeout behind.
- ``ProcessWorker``: ``python -m asyncrl.actors.rewards.worker`` (JSON lines on its stdin/stdout, no
  pickle), started under ``asyncrl.core.runtime.lifeline`` (it dies with the actor, however the actor
  dies) in a session of its own (terminal Ctrl-C reaches the actor only, and a kill takes
  whatever the reward started with it). One reader thread per process turns reply lines
  into future results.

Invariant: a worker runs one call at a time, and a worker that timed out, died or was
cancelled is never given another call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable

from asyncrl.actors.rewards.calls import Scored, score_call
from asyncrl.actors.rewards.loading import RewardFn
from asyncrl.actors.rewards.sandbox import SandboxError
from asyncrl.actors.rewards.worker import MEMORY_ENV
from asyncrl.core.runtime.fatal import FatalError
from asyncrl.core.runtime.lifeline import child_cmd, kill_tree, tagged_env, worker_stacks

START_TIMEOUT_S = 120.0
"""Longest a process worker may take to import the reward function's module."""
_JOIN_S = 2.0  # close(): wait this long for each killed worker to be reaped
_SECRET_ENV = ("ASYNCRL_REDIS_URL",)  # the buffer's password: a reward worker needs none
_SCORED = [f.name for f in dataclasses.fields(Scored)]


class WorkerDied(Exception):
    """The worker process ended while it had a call (or before it was ready)."""


class RewardWorkerError(FatalError):
    """A reward worker process could not load ``task.reward_fn`` (a restart would not help)."""


class ThreadWorker:
    """A daemon thread running submitted calls in order (see the module docstring)."""

    alive = True

    def __init__(self, fn: RewardFn) -> None:
        self.fn = fn
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="reward", daemon=True)
        self._thread.start()

    async def started(self) -> None:
        return None

    def submit(self, prompt: str, completion: str, fields: dict) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((lambda: score_call(self.fn, prompt, completion, fields), future))
        return future

    async def where(self) -> str:
        """Where the thread is now (the user code a timed-out call is stuck in)."""
        frame = sys._current_frames().get(self._thread.ident)
        return "".join(traceback.format_stack(frame)) if frame is not None else "(unknown)\n"

    def stop(self) -> None:
        """Abandon the thread: it leaves once the call it is in returns."""
        self._jobs.put(None)

    def join(self, timeout: float) -> None:
        return None  # an abandoned thread may be stuck in user code: never wait for it

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as e:  # SandboxError: re-raised in the awaiting task
                future.set_exception(e)


class ProcessWorker:
    """One ``asyncrl.actors.rewards.worker`` process loading the reward function by ``spec``."""

    def __init__(self, spec: str, memory_mb: int = 0) -> None:
        self.spec = spec
        fd, self._stack_path = tempfile.mkstemp(prefix="asyncrl-reward-stack-")
        os.close(fd)
        cmd = [sys.executable, "-m", "asyncrl.actors.rewards.worker", spec, self._stack_path]
        env, self.tag = tagged_env({k: v for k, v in os.environ.items() if k not in _SECRET_ENV})
        env[MEMORY_ENV] = str(memory_mb)  # task.reward_memory_mb (worker.py limit_memory)
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
        self.proc = subprocess.Popen(child_cmd(cmd), env=env, start_new_session=True, **pipes)
        self.ready: concurrent.futures.Future = concurrent.futures.Future()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._pending: tuple[int, concurrent.futures.Future] | None = None
        self._dead: WorkerDied | None = None
        self._reader = threading.Thread(target=self._read, name="reward-reader", daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self._dead is None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def started(self) -> None:
        """Wait until the process loaded the function; ``RewardWorkerError`` if it cannot."""
        try:
            msg = await asyncio.wait_for(asyncio.wrap_future(self.ready), START_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise RewardWorkerError(
                f"a reward worker process did not load task.reward_fn={self.spec} within "
                f"{START_TIMEOUT_S:g} s; check what importing it does, or use "
                "task.reward_executor=thread"
            ) from None
        except WorkerDied as e:
            raise RewardWorkerError(
                f"a reward worker process for task.reward_fn={self.spec} exited before it was "
                f"ready ({e}); its output is in the actor's log"
            ) from None
        if "error" in msg:
            raise RewardWorkerError(f"a reward worker process: {msg['error']}")

    def submit(self, prompt: str, completion: str, fields: dict) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        call_id = next(self._ids)
        try:
            line = json.dumps(
                {"id": call_id, "prompt": prompt, "completion": completion, "fields": fields}
            )
        except TypeError as e:
            raise TypeError(
                f"task.reward_executor=process sends a prompt's fields as JSON, and these are "
                f"not JSON values ({e}); make them JSON values or use task.reward_executor=thread"
            ) from None
        with self._lock:
            if self._dead is not None:
                future.set_exception(self._dead)
                return future
            self._pending = (call_id, future)
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:  # the process is gone: the reader fails the future at end of output
            pass
        return future

    async def where(self) -> str:
        """Every thread's stack in the process now (``faulthandler`` on ``SIGUSR1``)."""
        return await worker_stacks(self.proc.pid, self._stack_path)

    def stop(self) -> None:
        """SIGKILL the process and everything it started; the reader reaps it."""
        kill_tree(self.proc, self.tag)
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        with contextlib.suppress(OSError):
            os.unlink(self._stack_path)

    def join(self, timeout: float) -> None:
        self._reader.join(timeout)

    def _read(self) -> None:
        for raw in self.proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue  # not ours (the reward's prints go to stderr): never a reply
            if not self.ready.done():
                _settle(self.ready, msg)
                continue
            with self._lock:
                pending, self._pending = self._pending, None
            if pending is None or pending[0] != msg.get("id"):
                continue
            if "sandbox" in msg:
                _settle(pending[1], error=SandboxError(msg["sandbox"]))
            else:
                _settle(pending[1], Scored(**{k: msg[k] for k in _SCORED if k in msg}))
        code = self.proc.wait()
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        with self._lock:
            self._dead = WorkerDied(f"the reward worker process (pid {self.proc.pid}) died: {how}")
            pending, self._pending = self._pending, None
        _settle(self.ready, error=self._dead)
        if pending is not None:
            _settle(pending[1], error=self._dead)


Worker = ThreadWorker | ProcessWorker


def _settle(future: concurrent.futures.Future, result=None, error: BaseException | None = None):
    """Set ``future``'s outcome unless it is already done (cancelled by a timeout)."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


class RewardPool:
    """``await call(prompt, completion, fields) -> Scored``: see the module docstring.

    ``start()`` makes a new worker (``ThreadWorker`` or ``ProcessWorker``); workers start
    when first needed, so a pool nobody calls starts nothing. ``call`` raises only
    ``SandboxError``, ``RewardWorkerError`` and ``CancelledError``.
    """

    def __init__(self, start: Callable[[], Worker], size: int, timeout_s: float) -> None:
        if size < 1 or timeout_s <= 0:
            raise ValueError(f"need size >= 1 and timeout_s > 0, got {size}, {timeout_s}")
        self._start, self.size, self.timeout_s = start, size, timeout_s
        self._idle: list = []
        self.workers: set = set()
        """Every worker started and not stopped (idle or busy)."""
        self._free: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def call(self, prompt: str, completion: str, fields: dict) -> Scored:
        async with self._slots():
            worker = self._idle.pop() if self._idle else None
            keep = False
            try:
                if worker is None or not worker.alive:
                    self._drop(worker)
                    worker = self._start()
                    self.workers.add(worker)
                    await worker.started()
                scored, keep = await self._run(worker, prompt, completion, fields)
                return scored
            finally:
                if keep:
                    self._idle.append(worker)
                else:  # timed out, died, cancelled or failed: never reused
                    self._drop(worker)

    async def _run(self, worker, prompt: str, completion: str, fields: dict):
        future = worker.submit(prompt, completion, fields)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), self.timeout_s), True
        except asyncio.TimeoutError:
            message = f"the call took longer than task.reward_timeout_s={self.timeout_s:g} s"
            where = f"where it was:\n{await worker.where()}"
            return Scored(0.0, "timeout", f"timeout: {message}", where), False
        except WorkerDied as e:
            detail = "a new worker takes the next call; the dead one's output is in this log"
            return Scored(0.0, "crashed", f"crashed: {e}", detail), False

    def _slots(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a semaphore belongs to one loop; workers to none
            self._loop, self._free = loop, asyncio.Semaphore(self.size)
        return self._free

    def _drop(self, worker) -> None:
        if worker is not None:
            worker.stop()
            self.workers.discard(worker)

    def close(self) -> None:
        """Stop every worker (processes are killed and reaped); a later call starts anew."""
        workers, self.workers, self._idle = list(self.workers), set(), []
        for w in workers:
            w.stop()
        for w in workers:
            w.join(_JOIN_S)


class InlinePool:
    """``task.reward_executor=inline``: ``fn`` runs on the actor's event loop, one call after
    another, with no timeout and no isolation. For rewards that take microseconds (the
    built-in addition task's), where a worker's round trip costs far more than the call: on
    one core, 8 calls cost ~3-4 ms through threads or processes (benchmarks/README.md,
    micro_overheads). A slow or hanging function stalls the whole actor (weight syncs too)."""

    def __init__(self, fn: RewardFn) -> None:
        self.fn = fn
        self.workers: set = set()

    async def call(self, prompt: str, completion: str, fields: dict) -> Scored:
        return score_call(self.fn, prompt, completion, fields)

    def close(self) -> None:
        pass


def make_pool(fn: RewardFn, task) -> RewardPool | InlinePool:
    """The pool ``task`` (``TaskConfig``) asks for: ``reward_workers`` threads calling
    ``fn``, processes loading ``task.reward_fn`` themselves, or ``fn`` inline."""
    if task.reward_executor == "inline":
        return InlinePool(fn)
    if task.reward_executor == "thread":
        return RewardPool(lambda: ThreadWorker(fn), task.reward_workers, task.reward_timeout_s)
    spec, mb = task.reward_fn, worker_memory_mb(task)
    return RewardPool(lambda: ProcessWorker(spec, mb), task.reward_workers, task.reward_timeout_s)


def worker_memory_mb(task) -> int:
    """``task.reward_memory_mb`` resolved: 0 (auto) = half the machine's memory over the
    workers, at least 1024 MiB; -1 = no limit (returned as 0)."""
    if task.reward_memory_mb < 0:
        return 0
    if task.reward_memory_mb > 0:
        return task.reward_memory_mb
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
    return max(1024, total // 2 // task.reward_workers)
