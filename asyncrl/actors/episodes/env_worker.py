"""An environment worker process:
``python -m asyncrl.actors.episodes.env_worker SPEC TOOL_SPECS_JSON STACK_FILE KWARGS_JSON``.

Started by ``asyncrl.actors.episodes.env_pool``. It loads the environment class by ``SPEC``
(each episode's instance is ``Name(**KWARGS_JSON)``: ``episode.env_kwargs``) and the shared
tools by ``TOOL_SPECS_JSON`` (a JSON list of ``"module:function"``), then hosts
many episodes at once, one environment instance each, on an asyncio loop. JSON lines on
stdin/stdout (no pickle), replies in any order, matched by ``id``::

    -> {"ready": true}                                    or {"error": "..."} and exit 1
    <- {"id": 1, "op": "open", "episode": "e", "row": {...}}
    -> {"id": 1, "messages": [...], "tools": [schema, ...]}       Name(), reset(row)
    <- {"id": 2, "op": "step", "episode": "e", "message": {...}}
    -> {"id": 2, "result": {"messages": [...], "reward": 1.0, "done": true, "info": {}}}
    <- {"id": 3, "op": "tool", "episode": "e", "call": {"name": ..., "arguments": {...}}}
    -> {"id": 3, "result": {"name": ..., "content": "...", "error": null}}   ToolBox.call
    <- {"id": 4, "op": "close", "episode": "e"}   ->  {"id": 4, "ok": true}       close()
    <- {"id": 5, "op": "abandon", "of": 2}        ->  {"id": 5, "where": "...", "stuck": 1}
    -> {"id": 2, "error": "ValueError: ...", "traceback": "..."}   a call that raised

``abandon`` is the pool giving up on call ``of`` past its deadline: the reply (from the loop,
so it is also the proof that the loop is alive) says where that call is now (its coroutine
chain and its threads' stacks) and how many abandoned calls are still running. Nothing is
cancelled: an abandoned call keeps its episode's lock, so a later ``close`` runs only after it.

One episode's ``open``, ``step`` and ``close`` run one at a time (its lock); its tool calls run
at once, and ``close`` waits for them. Synchronous methods and tools run in threads
(``asyncio.to_thread``), so a slow step holds up no other episode. The reply channel is a
private copy of stdout: fd 1 points at stderr, so the environment's prints land in the
actor's log. ``SIGUSR1`` appends every thread's stack to ``STACK_FILE`` (``faulthandler``): the
pool's view of a worker whose loop is stuck. The worker exits at end of input. The serving
loop, ``abandon`` and the reply channel are ``worker_loop``'s (shared with the agent worker).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import sys
import traceback
from typing import Any

from asyncrl.actors.episodes.env import (
    check_messages,
    check_step_result,
    load_environment,
    load_tools,
)
from asyncrl.actors.episodes.tool_calls import ToolCall
from asyncrl.actors.episodes.tools import ToolBox, tool_from_function
from asyncrl.actors.episodes.worker_loop import Reply, Served, call_user, serve

_TOOLBOX_TIMEOUT_S = 1e9  # the pool's deadline is the one that counts (EnvTimeout)


@dataclasses.dataclass(eq=False)
class _Episode:
    env: Any
    box: ToolBox
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    tools_running: set[asyncio.Task] = dataclasses.field(default_factory=set)


class Host(Served):
    """The episodes of one worker; ``handle(request)`` serves one request (a task each)."""

    def __init__(
        self, spec: str, env_cls: type, shared_tools: list, reply, kwargs: dict | None = None
    ) -> None:
        super().__init__(reply)
        self.spec, self.env_cls, self.shared_tools = spec, env_cls, shared_tools
        self.new_env = functools.partial(env_cls, **(kwargs or {}))  # episode.env_kwargs
        self.episodes: dict[str, _Episode] = {}
        self.ops = {"open": self.open, "step": self.step, "tool": self.tool, "close": self.close}

    async def open(self, req: dict) -> dict:
        name = req["episode"]
        if name in self.episodes:
            raise ValueError(f"episode {name!r} is already open")
        env = await call_user(self.new_env)
        try:
            box = ToolBox([*_own_tools(env, self.spec), *self.shared_tools], _TOOLBOX_TIMEOUT_S)
            ep = self.episodes[name] = _Episode(env, box)
            async with ep.lock:
                where = f"environment {self.spec}: reset"
                messages = check_messages(await call_user(env.reset, req["row"]), where, False)
        except BaseException:
            self.episodes.pop(name, None)
            await _close(env)
            raise
        return {"messages": messages, "tools": box.schemas()}

    async def step(self, req: dict) -> dict:
        ep = self._episode(req["episode"])
        async with ep.lock:
            result = await call_user(ep.env.step, req["message"])
        checked = check_step_result(result, f"environment {self.spec}: step")
        return {"result": dataclasses.asdict(checked)}

    async def tool(self, req: dict) -> dict:
        ep = self._episode(req["episode"])
        task = asyncio.current_task()
        assert task is not None
        ep.tools_running.add(task)
        try:
            result = await ep.box.call(ToolCall(**req["call"]))
        finally:
            ep.tools_running.discard(task)
        return {"result": dataclasses.asdict(result)}

    async def close(self, req: dict) -> dict:
        ep = self.episodes.get(req["episode"])
        if ep is None:
            return {"ok": True}
        async with ep.lock:  # after its open or step, even one the pool abandoned
            if ep.tools_running:
                await asyncio.wait(list(ep.tools_running))
            self.episodes.pop(req["episode"], None)
            await call_user(getattr(ep.env, "close", None))
        return {"ok": True}

    def _episode(self, name: str) -> _Episode:
        if name not in self.episodes:
            raise ValueError(f"episode {name!r} is not open in this worker")
        return self.episodes[name]


def _own_tools(env: Any, spec: str) -> list:
    tools = getattr(env, "tools", None)
    if tools is None:
        return []
    out = tools()
    if not isinstance(out, (list, tuple)):
        raise TypeError(f"environment {spec}: tools() returned a {type(out).__name__}, not a list")
    return list(out)


async def _close(env: Any) -> None:
    try:
        await call_user(getattr(env, "close", None))
    except Exception:  # reset's error is the one to report
        traceback.print_exc()


def _probe(x: int) -> int:
    """A tool whose schema is built once at start.

    Args:
        x: A number.
    """
    return x


def main(argv: list[str]) -> int:
    spec, tool_specs, stack_file, env_kwargs = argv

    def build(reply: Reply) -> Host:
        kwargs = json.loads(env_kwargs)
        env_cls = load_environment(spec, kwargs)
        shared = load_tools(json.loads(tool_specs))
        ToolBox(shared)  # every shared tool's schema builds, now rather than at the first open
        if hasattr(env_cls, "tools"):  # schemas import torch (~2 s): before ready, not in open
            tool_from_function(_probe)
        return Host(spec, env_cls, shared, reply, kwargs)

    return serve(f"environment {spec}", stack_file, build)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
