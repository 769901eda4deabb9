"""A scripted generation engine for the actors' unit tests: it satisfies
``asyncrl.actors.engine.protocol.Engine`` (test_group_assembly checks that), returns
completions it is given and records every call. Weight syncs are refused unless asked for, so
a test that expects none fails if one happens."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from asyncrl.actors.engine.vllm_engine import Completion
from asyncrl.core.weights.stream import WeightSyncError

Reply = Callable[[list[int], int], list[Completion]]
"""``(prompt_ids, n) -> n completions``: the answer when no scripted round is left."""


@dataclass
class Call:
    """One ``generate`` call as the engine received it."""

    prompt_ids: list[int]
    n: int
    max_tokens: int
    temperature: float
    seed: int | None
    options: dict = field(default_factory=dict)


class ScriptedEngine:
    """``generate`` returns the next of ``rounds`` (one list of completions per call), else
    ``reply(prompt_ids, n)``; with neither it fails the test. ``syncs=True`` accepts weight
    syncs (recorded in ``joined`` / ``loaded``; ``fail_version`` raises ``WeightSyncError``).
    ``version``: the weights it claims to hold (the validator reads it)."""

    weights_valid = True

    def __init__(
        self,
        *rounds: list[Completion],
        reply: Reply | None = None,
        syncs: bool = False,
        fail_version: int | None = None,
        version: int = 0,
    ) -> None:
        self.rounds, self.reply, self.version = list(rounds), reply, version
        self.syncs, self.fail_version = syncs, fail_version
        self.calls: list[Call] = []
        self.joined: list[dict] = []
        self.loaded: list[tuple[int, str]] = []

    async def generate(self, prompt_ids, n, max_tokens, temperature=1.0, seed=None, **options):
        self.calls.append(Call(list(prompt_ids), n, max_tokens, temperature, seed, options))
        if self.rounds:
            return self.rounds.pop(0)
        if self.reply is None:
            raise AssertionError("ScriptedEngine: no scripted completions left")
        return self.reply(list(prompt_ids), n)

    async def join_weight_sync(self, init_info: dict) -> None:
        if not self.syncs:
            raise AssertionError("no weight sync in this test")
        self.joined.append(init_info)

    async def update_weights(self, version: int, mode: str = "keep") -> None:
        if not self.syncs:
            raise AssertionError("no weight sync in this test")
        if version == self.fail_version:
            raise WeightSyncError(f"checksum mismatch at v{version}")
        self.loaded.append((version, mode))

    async def shutdown(self) -> None:
        pass


class EngineCalls:
    """An agent endpoint's ``CallEngine`` (asyncrl/actors/agents/server.py) over an ``Engine``
    such as ``ScriptedEngine``: one completion per call, the call's fields passed on as
    ``generate``'s arguments (so ``engine.calls`` shows what each call sampled with)."""

    def __init__(self, engine) -> None:
        self.engine = engine

    async def complete(self, call):
        out = await self.engine.generate(
            call.prompt_ids, 1, call.max_tokens, call.temperature, call.seed, **call.options
        )
        return out[0]


class HangingCalls:
    """A ``CallEngine`` whose calls never finish: ``started`` is set when one begins,
    ``cancelled`` counts the ones cancelled (the episode's end must cancel them)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = 0

    async def complete(self, call):
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
