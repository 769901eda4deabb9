"""examples/smollm2_agent/agents_sdk.py, the calculator agent on the OpenAI Agents SDK, against
agent.py, the same agent on the plain ``openai`` client: each runs one episode through the
real endpoint (asyncrl/actors/agents/server.py on 127.0.0.1:0, the demo tokenizer) over the
same scripted replies, and the requests the endpoint received are compared. What the SDK
sends (module docstring of agents_sdk.py): ``model``, ``messages``, ``tools`` and nothing
else; its tool schema without agent.py's ``return`` and with ``strict``; the same
conversation, the tool messages' ids and names aside; so the same template tokens after the
prompt, the same call kinds (each call extends the one before) and the same reward. On
SmolLM2 with vLLM: tests/integration/test_smollm2.py."""

from __future__ import annotations

import asyncio
import copy
import os
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

pytest.importorskip("openai", reason="openai comes with vLLM; install vllm to run")
pytest.importorskip("aiohttp", reason="aiohttp comes with vLLM; install vllm to run")
pytest.importorskip("agents", reason="the OpenAI Agents SDK: pip install -e .[agents] (make test)")

from asyncrl.actors.agents.messages import canon  # noqa: E402
from asyncrl.actors.agents.policy import CallPolicy  # noqa: E402
from asyncrl.actors.agents.record import AgentEpisode, CallLimits  # noqa: E402
from asyncrl.actors.agents.server import AgentServer  # noqa: E402
from asyncrl.actors.agents.spec import load_agent  # noqa: E402
from asyncrl.actors.engine.completions import Completion  # noqa: E402
from asyncrl.orchestration.demo.tokenizer import build_tokenizer  # noqa: E402
from tests.fakes.engines import EngineCalls, ScriptedEngine  # noqa: E402
from tests.unit.examples.test_smollm2_tools import REPO  # noqa: E402

pytestmark = pytest.mark.timeout(120)

TOK = build_tokenizer()
PLAIN, SDK = "examples/smollm2_agent/agent.py:agent", "examples/smollm2_agent/agents_sdk.py:agent"
CALL = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "%s"}}\n</tool_call>'
LIMITS = CallLimits(max_calls=8, budget=4000, context=8000)  # the agents stop first (3 calls)


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")  # as the agent workers set it


@pytest.fixture(scope="module")
def agents():
    """Both agents, loaded by their specs from the repository root as the config loads them."""
    here = os.getcwd()
    os.chdir(REPO)
    try:
        return {spec: load_agent(spec).target for spec in (PLAIN, SDK)}
    finally:
        os.chdir(here)


@pytest.fixture(scope="module")
def row():
    """The first validation problem (19 * 43 = 817) as the agent gets it."""
    rec = pq.read_table(REPO / "examples/smollm2_tools/data/val.parquet").to_pylist()[0]
    return {"messages": rec["prompt"], "ground_truth": rec["reward_model"]["ground_truth"]}


def turn(text: str) -> list[Completion]:
    ids = TOK.encode(text, add_special_tokens=False)
    return [Completion(ids, [-0.5] * len(ids), [0] * len(ids), "stop")]


def run_episode(agent, row, script: list[str]) -> SimpleNamespace:
    """``agent``'s episode against the endpoint whose engine replies ``script`` in order:
    what it returned, the request bodies, the episode's record and the endpoint's counts."""

    async def go():
        server = AgentServer(EngineCalls(ScriptedEngine(*map(turn, script))), TOK)
        bodies, plan = [], server._plan
        server._plan = lambda ep, body: bodies.append(copy.deepcopy(body)) or plan(ep, body)
        url = await server.start()
        ep = AgentEpisode("ep0", row, 1000, CallPolicy(max_tokens=200, temperature=0.0), LIMITS)
        try:
            got = await agent(row, base_url=url, api_key=server.open(ep), model="policy")
        finally:
            await server.close()
        return SimpleNamespace(result=got, bodies=bodies, ep=ep, counts=server.counts)

    return asyncio.run(asyncio.wait_for(go(), 60))


def conversation(body: dict) -> list[dict]:
    """The request's messages as the endpoint matches them (``canon``), less what only names a
    tool message: its ``tool_call_id`` and ``name``."""
    out = []
    for m in map(canon, body["messages"]):
        if m["role"] == "tool":
            m.pop("tool_call_id", None), m.pop("name", None)
        out.append(m)
    return out


SCRIPTS = {
    "answer": ([CALL % "19 * 43", "The answer is 817."], (1.0, 2, 0)),
    "wrong": ([CALL % "19 + 43", "The answer is 62."], (0.0, 2, 0)),
    "tool error": ([CALL % "2 ** 100", CALL % "19 * 43", "817"], (1.0, 3, 1)),
    "unknown tool": (['<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call>',
                      "The answer is 817."], (1.0, 2, 1)),
    "malformed": (["<tool_call>\n{calculate 19 * 43}\n</tool_call>", "The answer is 817."],
                  (1.0, 2, 1)),
    "no answer": ([CALL % "19 * 43"] * 3, (0.0, 3, 0)),
}  # fmt: skip
"""script -> (the replies, the reward's (score, calls, tool_errors))"""


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_the_sdk_agent_sends_agent_pys_conversation(agents, row, name):
    script, (score, calls, tool_errors) = SCRIPTS[name]
    plain, sdk = (run_episode(agents[spec], row, script) for spec in (PLAIN, SDK))
    want = {"score": score, "calls": calls, "tool_errors": tool_errors}
    assert plain.result == sdk.result == want
    # every call: the same messages (the tool results' answers included), the same kinds
    assert len(sdk.bodies) == len(plain.bodies) == calls
    for s, p in zip(sdk.bodies, plain.bodies, strict=True):
        assert conversation(s) == conversation(p)
    kinds = ["first"] + ["extend"] * (calls - 1)
    assert [c.kind for c in sdk.ep.calls] == [c.kind for c in plain.ep.calls] == kinds
    # one segment: after the prompt, the same model and template tokens
    (seg_sdk,), (seg_plain,) = sdk.ep.segments, plain.ep.segments
    assert (seg_sdk.traj.ids, seg_sdk.traj.mask) == (seg_plain.traj.ids, seg_plain.traj.mask)
    counts = sdk.counts
    assert (dict(counts.refused), dict(counts.overridden)) == ({}, {})
    assert (counts.model_other, counts.retries) == (0, 0)


def test_what_the_sdk_sends_besides_the_conversation(agents, row):
    """Only ``model``, ``messages`` and ``tools``. The schema: agent.py's name, description
    and parameters, without its ``return`` and with ``"strict": false`` (the SDK writes every
    function tool so). The worked examples' tool messages carry a ``tool_call_id`` each
    (``example_<index>``); a tool result carries the endpoint's call id, no ``name``."""
    script, _ = SCRIPTS["answer"]
    plain, sdk = (run_episode(agents[spec], row, script) for spec in (PLAIN, SDK))
    assert {tuple(sorted(b)) for b in sdk.bodies} == {("messages", "model", "tools")}
    (sent,) = sdk.bodies[0]["tools"]
    (theirs,) = plain.bodies[0]["tools"]
    expected = {k: v for k, v in theirs["function"].items() if k != "return"}
    assert theirs["function"]["return"] == {"type": "string"}
    assert sent == {"type": "function", "function": {**expected, "strict": False}}
    first, second = sdk.bodies
    assert [m for m in first["messages"] if m["role"] == "tool"] == [
        {"role": "tool", "tool_call_id": "example_3", "content": "888"},
        {"role": "tool", "tool_call_id": "example_7", "content": "434"},
    ]
    reply, result = second["messages"][-2:]
    assert reply["content"] is None and len(reply["tool_calls"]) == 1
    assert result == {"role": "tool", "tool_call_id": "call_ep0_0_0", "content": "817"}
    # the prompts differ in the tools' line only: the endpoint writes it into the system message
    assert sdk.ep.segments[0].traj.prompt_ids != plain.ep.segments[0].traj.prompt_ids


def test_a_streamed_sdk_run_extends_its_calls_as_a_plain_one(agents, row):
    """``Runner.run_streamed`` with the example's tool: each call asks ``stream: true`` (no
    ``stream_options``: the SDK adds them for api.openai.com only), the endpoint answers it as
    a stream of the whole reply, and the reply the SDK assembles from the chunks, sent back,
    extends the segment as the non-streamed run's does."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner
    from openai import AsyncOpenAI

    example = SimpleNamespace(**agents[SDK].__globals__)  # agents_sdk.py's names

    async def streamed(row, *, base_url, api_key, model):
        client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        llm = OpenAIChatCompletionsModel(model=model, openai_client=client)
        calculator = Agent(name="calculator", model=llm, tools=[example.CALCULATOR])
        items, ep = example.input_items(row["messages"]), example.Episode()
        async with client:
            run = Runner.run_streamed(
                calculator, items, context=ep, max_turns=3, run_config=example.RUN
            )
            async for _ in run.stream_events():
                pass
        return run.final_output

    script, _ = SCRIPTS["answer"]
    got, plain = run_episode(streamed, row, script), run_episode(agents[SDK], row, script)
    assert got.result == "he answer is 817."  # the demo tokenizer has no capitals
    assert [b.get("stream") for b in got.bodies] == [True, True]
    assert not any("stream_options" in b for b in got.bodies)
    for s, p in zip(got.bodies, plain.bodies, strict=True):
        assert s["messages"] == p["messages"] and s["tools"] == p["tools"]
    assert [c.kind for c in got.ep.calls] == ["first", "extend"] and got.counts.streamed == 2
    (seg,), (seg_plain,) = got.ep.segments, plain.ep.segments
    assert (seg.traj.prompt_ids, seg.traj.ids) == (seg_plain.traj.prompt_ids, seg_plain.traj.ids)
