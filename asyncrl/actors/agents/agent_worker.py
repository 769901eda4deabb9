"""An agent worker process:
``python -m asyncrl.actors.agents.agent_worker SPEC TOOL_SPECS_JSON STACK_FILE KWARGS_JSON``.

Started by ``episodes.env_pool.EnvPool(..., module=AGENT_WORKER)`` with the environment
worker's argv (``TOOL_SPECS_JSON`` must be ``[]``: an agent brings its own tools). It loads
the agent by ``SPEC`` (``spec.load_agent``, ``KWARGS_JSON`` = ``episode.agent_kwargs``), then
runs many episodes at once on one asyncio loop, sync agents in threads, with the environment
worker's serving loop (``episodes.worker_loop``: JSON lines, replies in any order, matched by
``id``)::

    -> {"ready": true}                                    or {"error": "..."} and exit 1
    <- {"id": 1, "op": "open", "episode": "e"}        ->  {"id": 1, "ok": true}  Name(**kwargs)
    <- {"id": 2, "op": "run", "episode": "e", "row": {...}, "base_url": "http://127.0.0.1:P/v1",
        "api_key": "sk-asyncrl-...", "model": "policy"}
    -> {"id": 2, "result": {"score": 1.0, "extras": {"calls": 3.0}}}   (score None: reward_fn)
    <- {"id": 3, "op": "close", "episode": "e"}       ->  {"id": 3, "ok": true}  close()
    <- {"id": 4, "op": "abandon", "of": 2}            ->  {"id": 4, "where": "...", "stuck": 1}
    -> {"id": 2, "error": "ValueError: ...", "traceback": "..."}   the agent raised, or
                                     "AgentReturnError: wrong_type: ..." (spec.check_result)

The key travels on stdin, never in argv or the environment. One episode's ``run`` and
``close`` take its lock: a ``close`` after a ``run`` the pool abandoned (its deadline passed)
waits for it, as an environment's does; the abandoned agent's key is revoked by then, so its
next call to the endpoint fails. At start ``127.0.0.1,localhost`` join ``NO_PROXY`` and
``no_proxy``: an ``HTTP_PROXY`` would otherwise route the agent's loopback calls through a
proxy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
from collections.abc import MutableMapping
from typing import Any

from asyncrl.actors.agents.spec import Agent, call_agent, check_result, load_agent
from asyncrl.actors.episodes.worker_loop import Reply, Served, call_user, serve

AGENT_WORKER = "asyncrl.actors.agents.agent_worker"
"""This module: ``EnvPool(..., module=AGENT_WORKER)`` runs agents."""
LOOPBACK = ("127.0.0.1", "localhost")


@dataclasses.dataclass(eq=False)
class _Episode:
    agent: Any
    """``Agent.make()``: the instance of a class, or the function."""
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)


class AgentHost(Served):
    """The agent episodes of one worker (``ops``: open, run, close)."""

    def __init__(self, agent: Agent, reply: Reply) -> None:
        super().__init__(reply)
        self.agent = agent
        self.episodes: dict[str, _Episode] = {}
        self.ops = {"open": self.open, "run": self.run, "close": self.close}

    async def open(self, req: dict) -> dict:
        name = req["episode"]
        if name in self.episodes:
            raise ValueError(f"episode {name!r} is already open")
        self.episodes[name] = _Episode(await call_user(self.agent.make))
        return {"ok": True}

    async def run(self, req: dict) -> dict:
        ep = self._episode(req["episode"])
        async with ep.lock:
            fn = self.agent.runner(ep.agent)
            out = await call_agent(fn, req["row"], req["base_url"], req["api_key"], req["model"])
        result = check_result(out, f"agent {self.agent.spec}")
        return {"result": dataclasses.asdict(result)}

    async def close(self, req: dict) -> dict:
        ep = self.episodes.get(req["episode"])
        if ep is None:
            return {"ok": True}
        async with ep.lock:  # after its run, even one the pool abandoned
            self.episodes.pop(req["episode"], None)
            await call_user(self.agent.closer(ep.agent))
        return {"ok": True}

    def _episode(self, name: str) -> _Episode:
        if name not in self.episodes:
            raise ValueError(f"episode {name!r} is not open in this worker")
        return self.episodes[name]


def no_proxy_loopback(environ: MutableMapping[str, str] = os.environ) -> None:
    """Add ``LOOPBACK`` to ``NO_PROXY`` and ``no_proxy`` (both set to the union of what either
    held: clients read one or the other)."""
    names = ("NO_PROXY", "no_proxy")
    hosts = [h.strip() for n in names for h in environ.get(n, "").split(",") if h.strip()]
    merged = ",".join(dict.fromkeys([*hosts, *LOOPBACK]))
    for n in names:
        environ[n] = merged


def main(argv: list[str]) -> int:
    spec, tool_specs, stack_file, kwargs = argv
    no_proxy_loopback()

    def build(reply: Reply) -> AgentHost:
        if json.loads(tool_specs):
            raise ValueError(
                f"agent {spec}: episode.tools {json.loads(tool_specs)} cannot go with an agent; "
                "an agent runs its own tools (leave episode.tools empty)"
            )
        return AgentHost(load_agent(spec, json.loads(kwargs)), reply)

    return serve(f"agent {spec}", stack_file, build)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
