"""Agents as a user writes them (asyncrl/actors/agents/spec.py), one per way an agent can
end, for the agent worker's tests. The worker loads them from this file by path
(``spec_of(name)``); like a user's agent they import nothing of asyncrl (``openai`` only
inside ``chats``, which calls the endpoint)."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import threading
import time
from pathlib import Path


def spec_of(name: str) -> str:
    """The agent spec of ``name`` in this file (``"/.../agents.py:name"``)."""
    return f"{Path(__file__).resolve()}:{name}"


async def returns_float(row, *, base_url, api_key, model):
    return 0.75


async def returns_dict(row, *, base_url, api_key):
    return {"score": 1.0, "calls": 2, "solved": True, "note": "not a number: not an extra"}


async def returns_none(row, **kw):
    return None  # the task's reward_fn scores the last answer


async def raises(row, *, base_url, api_key):
    raise ValueError(f"the agent gave up on {row['prompt']!r}")


async def hangs(row, *, base_url, api_key):
    await asyncio.Event().wait()


def blocks(row, *, base_url, api_key):
    time.sleep(3600)  # a sync agent stuck in its thread; the worker's loop stays free


async def exits(row, **kw):
    os._exit(3)


async def bad_value(row, *, base_url, api_key):
    return row.get("value", "1.0")  # a string: not a reward


def sync_agent(row, *, base_url, api_key, model):
    in_thread = threading.current_thread() is not threading.main_thread()
    return {"score": 0.5, "in_thread": in_thread, "pid": os.getpid()}


async def sleeps(row, *, base_url, api_key):
    await asyncio.sleep(row["sleep"])
    return {"score": 0.0, "pid": os.getpid()}


async def with_extra(row, *, base_url, api_key, bonus: float):
    return bonus  # bonus: from episode.agent_kwargs


class Counter:
    """One instance per episode: ``run`` counts from ``start`` (agent_kwargs); ``close``
    writes the count to the row's ``closed`` path, if any."""

    def __init__(self, start: int = 0) -> None:
        self.n, self.closed_to = start, ""

    async def run(self, row, *, base_url, api_key, model):
        self.n += 1
        self.closed_to = row.get("closed", "")
        return float(self.n)

    def close(self) -> None:
        if self.closed_to:
            Path(self.closed_to).write_text(str(self.n))


async def chats(row, *, base_url, api_key, model):
    """One chat call to the endpoint with the plain ``openai`` client; what it was given and
    what it got are written to the row's ``out`` path (JSON)."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=20)
    try:
        models = [m.id for m in (await client.models.list()).data]
        r = await client.chat.completions.create(model=model, messages=row["messages"])
    finally:
        await client.close()
    content = r.choices[0].message.content
    seen = {"base_url": base_url, "api_key": api_key, "model": model, "models": models}
    seen |= {"content": content, "no_proxy": os.environ.get("no_proxy", "")}
    Path(row["out"]).write_text(json.dumps(seen))
    return {"score": float(content == row["expect"])}


CALC = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "evaluate a sum",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


async def plays(row, *, base_url, api_key, model):
    """Plays the part ``row["part"]`` against the endpoint with the plain ``openai`` client
    (one spec for many kinds of episode, so a test starts one worker pool):

    ``answers``       one call with ``row["messages"]`` (and ``row["create"]``'s keywords);
                      returns ``row["result"]`` (None: the task's reward_fn scores)
    ``uses_tools``    calls with the calculator until a reply calls no tool, running each
                      call itself (the returned message sent back as received); returns 1.0
                      if the last answer is ``row["answer"]``
    ``until_refused`` calls "again" until the endpoint refuses (a budget spent); then
                      returns ``row["result"]``, or raises if ``row["reraise"]``
    ``calls_then_raises``  one call, then raises
    ``with_subagent`` asks a sub-agent first (a fresh conversation, ``row["sub"]``, with
                      the calculator if ``row["sub_tools"]``), then plays ``uses_tools``:
                      two call chains in one episode
    any other         the agent of that name in this file (no call to the endpoint)
    """
    import openai

    part = row["part"]
    if part not in _PARTS:
        fn = globals()[part]
        given = {"base_url": base_url, "api_key": api_key, "model": model}
        names = inspect.signature(fn).parameters
        return await fn(row, **{k: v for k, v in given.items() if k in names or "kw" in names})
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=20)
    try:
        return await _PARTS[part](client, model, row)
    finally:
        await client.close()


async def _answers(client, model, row):
    create = row.get("create") or {}  # what else the call asks (temperature, ...)
    await client.chat.completions.create(model=model, messages=row["messages"], **create)
    return row.get("result")


async def _uses_tools(client, model, row):
    msgs = list(row["messages"])
    for _ in range(4):
        r = await client.chat.completions.create(model=model, messages=msgs, tools=[CALC])
        message = r.choices[0].message
        msgs.append(message)
        if not message.tool_calls:
            return float((message.content or "").strip() == row["answer"])
        for tc in message.tool_calls:
            a, b = json.loads(tc.function.arguments)["expression"].split("+")
            msgs.append({"role": "tool", "tool_call_id": tc.id, "content": str(int(a) + int(b))})
    return 0.0


async def _until_refused(client, model, row):
    import openai

    msgs = list(row["messages"])
    try:
        while True:
            r = await client.chat.completions.create(model=model, messages=msgs)
            msgs += [r.choices[0].message, {"role": "user", "content": "again"}]
    except openai.BadRequestError:
        if row.get("reraise"):
            raise
    return row.get("result")


async def _calls_then_raises(client, model, row):
    await client.chat.completions.create(model=model, messages=row["messages"])
    raise RuntimeError("the agent broke after its first call")


async def _with_subagent(client, model, row):
    sub = [{"role": "user", "content": row.get("sub", "what is 2+2?")}]
    tools = {"tools": [CALC]} if row.get("sub_tools") else {}
    await client.chat.completions.create(model=model, messages=sub, **tools)
    return await _uses_tools(client, model, row)


_PARTS = {
    "answers": _answers,
    "with_subagent": _with_subagent,
    "uses_tools": _uses_tools,
    "until_refused": _until_refused,
    "calls_then_raises": _calls_then_raises,
}
