"""What an actor's episodes are doing now: model requests and environment calls in flight.

The actor's time clock (asyncrl/actors/actor.py) asks ``Activity.waiting_env`` to tell its
``waiting_env`` state (groups in flight, none of them at the engine: every one waits for its
environment or tools) from ``generating``, so a benchmark reads how long a slow environment
left the engine idle instead of an estimate. ``CountedHost`` wraps the environment host and
the group maker's ``generate`` wraps itself in ``activity.running("generating")``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from asyncrl.actors.episodes.env import StepResult
from asyncrl.actors.episodes.runner import EnvHost
from asyncrl.actors.episodes.tool_calls import ToolCall
from asyncrl.actors.episodes.tools import ToolResult


@dataclass
class Activity:
    """Counts of model requests (``generating``) and environment calls (``env``) in flight;
    ``on_change()`` after each change (the actor refreshes its clock's state).

    Invariant: both counts are >= 0 and return to 0 when nothing is in flight, whatever
    raised (``running`` decrements in ``finally``)."""

    generating: int = 0
    env: int = 0
    on_change: Callable[[], None] = field(default=lambda: None)

    @property
    def waiting_env(self) -> bool:
        """Some episode waits for its environment and none for the engine."""
        return self.env > 0 and self.generating == 0

    @contextmanager
    def running(self, kind: str) -> Iterator[None]:
        """Count one ``kind`` (``"generating"`` or ``"env"``) call for the block's duration."""
        setattr(self, kind, getattr(self, kind) + 1)
        self.on_change()
        try:
            yield
        finally:
            setattr(self, kind, getattr(self, kind) - 1)
            self.on_change()


@dataclass
class CountedHost:
    """``host`` (an ``EnvHost``) whose ``open``, ``step`` and ``tool`` calls count as
    ``activity``'s ``env`` while they run; ``close`` and the rest pass through."""

    host: EnvHost
    activity: Activity

    async def open(self, episode_id: str, row: dict) -> tuple[list[dict], list[dict]]:
        with self.activity.running("env"):
            return await self.host.open(episode_id, row)

    async def step(self, episode_id: str, message: dict) -> StepResult:
        with self.activity.running("env"):
            return await self.host.step(episode_id, message)

    async def tool(self, episode_id: str, call: ToolCall) -> ToolResult:
        with self.activity.running("env"):
            return await self.host.tool(episode_id, call)

    async def close(self, episode_id: str) -> None:
        await self.host.close(episode_id)

    def __getattr__(self, name: str):  # shutdown, counters, pids: the pool's own
        if name == "host":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.host, name)
