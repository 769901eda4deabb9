"""The serving loop of a worker process (``env_worker``, ``agents.agent_worker``): JSON-line
requests on stdin served at once on one asyncio loop, replies on a private copy of stdout.

    serve(who, stack_file, build)   reply_channel -> build(reply) -> {"ready": true}
      '-> _serve: a reader thread queues each line; each request a task of its own
            Served.handle: ops[op](request) -> {"id", ...reply} | {"id", "error", "traceback"}
                           "abandon" answered at once from the loop: where a call is now

User code runs through ``call_user``: awaited if async, else in a thread of a
``_TracingExecutor`` that records which request each thread serves, so ``abandon`` can show a
stuck call's coroutine chain and its threads' stacks. The protocol of each worker (its ops and
their fields) is in its own module's docstring.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import faulthandler
import inspect
import json
import os
import signal
import sys
import threading
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

THREADS = 256
"""Most synchronous calls running at once (the default, cores + 4, would queue the 7th slow
step of a 2-core machine behind the others)."""


@dataclasses.dataclass(eq=False)
class _Call:
    """One request being served: its task and the threads running its user code."""

    what: str
    task: asyncio.Task | None
    threads: set[int] = dataclasses.field(default_factory=set)


_CURRENT: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("call", default=None)


class _TracingExecutor(concurrent.futures.ThreadPoolExecutor):
    """Records which thread runs each request's user code (``where``); ``asyncio.to_thread``
    submits from the request's task, whose context names the request."""

    def submit(self, fn, /, *args, **kwargs):
        call = _CURRENT.get()
        if call is None:
            return super().submit(fn, *args, **kwargs)

        def traced():
            me = threading.get_ident()
            call.threads.add(me)
            try:
                return fn(*args, **kwargs)
            finally:
                call.threads.discard(me)

        return super().submit(traced)


class Served:
    """A worker's requests, served at once (a task each, by ``_serve``): ``ops`` maps an op's
    name to ``async fn(request) -> reply fields``; a raise is replied as ``error`` with its
    ``traceback``. ``abandon`` is answered here, from the loop (see the module docstring).
    ``reply(obj, what)`` writes one reply line (``reply_channel``).

    Invariant: ``calls`` holds the requests being served, ``abandoned`` those of them the
    pool gave up on; a request leaves both when it returns, however it returns."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.calls: dict[Any, _Call] = {}
        self.abandoned: set[_Call] = set()
        self.ops: dict[str, Callable[[dict], Awaitable[dict]]] = {}

    async def handle(self, req: dict) -> None:
        rid = req.get("id")
        if req.get("op") == "abandon":  # at once, from the loop: also the proof that it runs
            try:
                self.reply({"id": rid, **self.abandon(req.get("of"))})
            except Exception as e:
                self.reply({"id": rid, "where": f"(unknown: {type(e).__name__}: {e})"})
            return
        op = self.ops.get(str(req.get("op")))
        call = _Call(f"{req.get('op')} of episode {req.get('episode')!r}", asyncio.current_task())
        self.calls[rid] = call
        _CURRENT.set(call)  # this task's own context
        try:
            if op is None:
                raise ValueError(f"unknown op {req.get('op')!r}")
            self.reply({"id": rid, **await op(req)}, call.what)
        except Exception as e:
            self.reply(
                {
                    "id": rid,
                    "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc(),
                }
            )
        finally:
            self.calls.pop(rid, None)
            self.abandoned.discard(call)

    def abandon(self, call_id: Any) -> dict:
        call = self.calls.get(call_id)
        if call is not None:
            self.abandoned.add(call)
            where = f"{call.what}:\n{_stack_of(call)}"
        else:
            where = "(it had returned by then)\n"
        return {"where": where, "stuck": len(self.abandoned)}


async def call_user(fn, *args) -> Any:
    """``fn(*args)``: awaited if async, else in a thread; an awaitable result is awaited."""
    if fn is None:
        return None
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    out = await asyncio.to_thread(fn, *args)
    return await out if inspect.isawaitable(out) else out


def _stack_of(call: _Call) -> str:
    """The call's coroutine chain (innermost last), then each of its threads' stacks."""
    lines: list[str] = []
    obj: Any = call.task.get_coro() if call.task is not None else None
    frames = []
    while obj is not None:
        frame = getattr(obj, "cr_frame", None) or getattr(obj, "gi_frame", None)
        if frame is None:
            break
        frames.append(frame)
        obj = getattr(obj, "cr_await", None) or getattr(obj, "gi_yieldfrom", None)
    if frames:
        summary = traceback.StackSummary.extract((f, f.f_lineno) for f in frames)
        lines += ["coroutines:\n", *summary.format()]
    current = sys._current_frames()
    for ident in list(call.threads):
        if ident in current:
            stack = traceback.extract_stack(current[ident])
            start = next((i + 1 for i, f in enumerate(stack) if f.name == "traced"), 0)
            own = traceback.StackSummary.from_list(stack[start:])
            lines += [f"thread {ident}:\n", *own.format()]
    return "".join(lines) or "(no frame: between two awaits)\n"


Reply = Callable[..., None]
"""``reply(obj, what="")``: one reply line (``what`` names the call in a not-JSON error)."""


def serve(who: str, stack_file: str, build: Callable[[Reply], Served]) -> int:
    """A worker's life: the reply channel (``reply_channel``), ``build(reply)`` (a raise is
    replied as ``{"error": ...}``, exit 1: it names the spec and the fix, or an import
    failure), ``{"ready": true}``, then requests until end of input (``_serve``)."""
    reply = reply_channel(who, stack_file)
    try:
        host = build(reply)
    except Exception as e:
        reply({"error": f"{e}\n{traceback.format_exc()}"})
        return 1
    reply({"ready": True})
    asyncio.run(_serve(host))
    return 0


def reply_channel(who: str, stack_file: str) -> Reply:
    """The reply writer: a private copy of stdout, fd 1 pointed at stderr (so the user code's
    prints land in the actor's log), ``SIGUSR1`` dumping every thread's stack to
    ``stack_file``. A reply that is not JSON goes out as an error naming ``who`` (``"environment
    x.py:Env"``) and the call."""
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # the user code's prints go to the actor's log, not into the replies
    sys.stdout = sys.stderr
    stacks = open(stack_file, "a")  # noqa: SIM115 (append: the pool empties it before a dump)
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)

    def reply(obj: dict, what: str = "") -> None:
        try:
            line = json.dumps(obj)
        except (TypeError, ValueError) as e:
            line = json.dumps(
                {
                    "id": obj.get("id"),
                    "error": f"TypeError: {who}: {what} returned a value that is "
                    f"not JSON ({e}); return str, numbers, bools, None, lists and dicts",
                    "traceback": "",
                }
            )
        replies.write(line + "\n")
        replies.flush()

    return reply


async def _serve(host: Served) -> None:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(_TracingExecutor(THREADS, thread_name_prefix="user"))
    requests: asyncio.Queue[bytes | None] = asyncio.Queue()

    def read() -> None:  # a thread: stdin is drained even while the loop is busy
        for line in sys.stdin.buffer:
            loop.call_soon_threadsafe(requests.put_nowait, line)
        loop.call_soon_threadsafe(requests.put_nowait, None)

    threading.Thread(target=read, name="requests", daemon=True).start()
    tasks: set[asyncio.Task] = set()
    while (line := await requests.get()) is not None:
        task = asyncio.create_task(host.handle(json.loads(line)))  # a context of its own
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    os._exit(0)  # end of input; abandoned calls may still hold threads: do not wait for them
