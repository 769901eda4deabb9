"""An in-process environment host for the episode runner's unit tests: it satisfies
``asyncrl.actors.episodes.runner.EnvHost`` with a scripted environment and tools, no worker
process, and records every call."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from asyncrl.actors.episodes.env import StepResult
from asyncrl.actors.episodes.env_pool import EnvCrashed, EnvError, EnvTimeout
from asyncrl.actors.episodes.tool_calls import ToolCall
from asyncrl.actors.episodes.tools import ToolBox, ToolResult

FAILURES = {"timeout": EnvTimeout, "error": EnvError, "crash": EnvCrashed}


@dataclass
class ScriptedHost:
    """``opening`` messages from ``open``; each ``step`` answers the next of ``steps`` (a
    ``StepResult``, or one of ``FAILURES``' keys to raise it); ``tools`` are plain functions.
    ``fail_open``: a ``FAILURES`` key that ``open`` raises. ``delay_s``: every tool call
    sleeps this long first (episodes overlap meanwhile)."""

    opening: list[dict]
    steps: list[StepResult | str] = field(default_factory=list)
    tools: list[Callable] = field(default_factory=list)
    fail_open: str = ""
    delay_s: float = 0.0
    calls: list[tuple] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.box = ToolBox(self.tools)
        self._steps: dict[str, list] = {}

    async def open(self, episode_id: str, row: dict) -> tuple[list[dict], list[dict]]:
        self.calls.append(("open", episode_id, row))
        if self.fail_open:
            raise FAILURES[self.fail_open](f"scripted {self.fail_open} in reset")
        self._steps[episode_id] = list(self.steps)
        return [dict(m) for m in self.opening], self.box.schemas()

    async def step(self, episode_id: str, message: dict) -> StepResult:
        self.calls.append(("step", episode_id, message))
        nxt = self._steps[episode_id].pop(0)
        if isinstance(nxt, str):
            raise FAILURES[nxt](f"scripted {nxt} in step")
        return nxt

    async def tool(self, episode_id: str, call: ToolCall) -> ToolResult:
        self.calls.append(("tool", episode_id, call))
        await asyncio.sleep(self.delay_s)
        return await self.box.call(call)

    async def close(self, episode_id: str) -> None:
        self.calls.append(("close", episode_id))
        self._steps.pop(episode_id, None)

    async def shutdown(self) -> None:
        pass
