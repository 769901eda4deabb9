"""actors/engine/vllm_engine.py ``ActorEngine._pause``: a weight sync pauses vLLM's scheduler directly
(keeping the mode and clearing the cache as ``pause_generation`` does) without vLLM's closing
20 ms sleep, and falls back to ``pause_generation`` where a vLLM lacks the scheduler call. The
real engine's path is checked in tests/integration/test_weight_sync.py. Fakes stand in for vLLM."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from asyncrl.actors.engine.vllm_engine import ActorEngine


def _engine(llm) -> ActorEngine:
    return ActorEngine(llm, version=0)


class Calls:
    def __init__(self):
        self.calls: list[tuple] = []

    def recorder(self, name: str):
        async def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))

        return call


@pytest.mark.parametrize("mode", ["keep", "abort"])
def test_the_scheduler_is_paused_directly_with_the_mode_and_a_cleared_cache(mode):
    log = Calls()
    llm = SimpleNamespace(
        engine_core=SimpleNamespace(pause_scheduler_async=log.recorder("scheduler")),
        renderer=SimpleNamespace(clear_mm_cache_async=log.recorder("mm_cache")),
        pause_generation=log.recorder("pause_generation"),
    )
    asyncio.run(_engine(llm)._pause(mode))
    assert log.calls == [
        ("mm_cache", (), {}),
        ("scheduler", (), {"mode": mode, "clear_cache": True}),
    ]


def test_a_vllm_without_the_scheduler_call_pauses_through_pause_generation():
    log = Calls()
    llm = SimpleNamespace(engine_core=SimpleNamespace(), pause_generation=log.recorder("pause"))
    asyncio.run(_engine(llm)._pause("keep"))
    assert log.calls == [("pause", (), {"mode": "keep"})]
