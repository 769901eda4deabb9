"""A user's agent for tests/e2e/test_agent_run.py: chained sums asked with the plain
``openai`` client, as anyone would write it (it imports nothing of asyncrl).

    user:      what is 12+5? answer with the number only.
    assistant: 17                          (the reply sent back as received)
    user:      what is 17+3? answer with the number only.
    assistant: 20                          -> reward: the fraction answered right

Some episodes misbehave, chosen from the row (``row["episode"]``, which of the group's n it
is), so that every group holds each way an agent episode can end: ``RAISES`` raises after
its first call, ``NO_CALL`` returns without calling the model, ``HANGS`` sleeps past
``episode.agent_timeout_s``. ``ASKS_FIRST`` answers too, after a call of its own that no
later call extends (a sub-agent asked the first sum alone): two call chains in one episode.
"""

from __future__ import annotations

import asyncio

import openai

QUESTION = "what is {a}+{b}? answer with the number only."
ASKS_FIRST, RAISES, NO_CALL, HANGS = 2, 3, 4, 5
"""The episode indices (of a group's n >= 6) that misbehave; the others answer."""
HANG_S = 4.0  # past the run's agent_timeout_s; short, so an abandoned run ends soon after


async def agent(row, *, base_url, api_key, model):
    j = row["episode"]
    if j == NO_CALL:
        return 0.0
    if j == HANGS:
        await asyncio.sleep(HANG_S)
        return 0.0
    a, b = int(row["a"]), int(row["b"])
    c = (a + b) % 9 + 1  # the second addend: a function of the row
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    async with client:
        if j == ASKS_FIRST:  # a sub-agent's conversation: "solve it alone first"
            alone = [{"role": "user", "content": f"{a}+{b}=? think alone."}]
            await client.chat.completions.create(model=model, messages=alone)
        messages = [{"role": "user", "content": QUESTION.format(a=a, b=b)}]
        r = await client.chat.completions.create(model=model, messages=messages)
        first = r.choices[0].message
        if j == RAISES:
            raise RuntimeError(f"the agent gave up after {first.content!r}")
        messages += [first, {"role": "user", "content": QUESTION.format(a=a + b, b=c)}]
        r = await client.chat.completions.create(model=model, messages=messages)
        second = r.choices[0].message
    right = [
        (first.content or "").strip() == str(a + b),
        (second.content or "").strip() == str(a + b + c),
    ]
    return {"score": sum(right) / 2, "calls": 2}
