"""The agent endpoint (asyncrl/actors/agents/server.py) as an agent sees it: the real aiohttp
server on 127.0.0.1:0 and the real ``openai.AsyncOpenAI`` client, over a scripted engine
(tests/fakes/engines.py) and the demo tokenizer. A tool call round trip (the returned message
sent back extends the segment), wrong and ended keys (``AuthenticationError``), refused
requests and spent budgets (``BadRequestError`` naming the field), the run's sampling in
place of the call's, and an episode's end cancelling its call in flight."""

from __future__ import annotations

import asyncio
import json

import pytest

openai = pytest.importorskip("openai", reason="openai comes with vLLM; install vllm to run")
pytest.importorskip("aiohttp", reason="aiohttp comes with vLLM; install vllm to run")

from asyncrl.actors.agents.policy import CallPolicy  # noqa: E402
from asyncrl.actors.agents.record import AgentEpisode, CallLimits  # noqa: E402
from asyncrl.actors.agents.server import AgentServer, ServerOptions  # noqa: E402
from asyncrl.actors.engine.completions import Completion  # noqa: E402
from asyncrl.actors.episodes.render import ChatRenderer  # noqa: E402
from asyncrl.orchestration.demo.tokenizer import build_tokenizer  # noqa: E402
from tests.fakes.agents import CALC  # noqa: E402
from tests.fakes.engines import EngineCalls, HangingCalls, ScriptedEngine  # noqa: E402

pytestmark = pytest.mark.timeout(60)

TOK = build_tokenizer()
QUESTION = [{"role": "user", "content": "what is 1+2?"}]
CALL_TEXT = '<tool_call>{"name": "calculate", "arguments": {"expression": "1+2"}}</tool_call>'


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")  # as the agent workers will set it


def turn(text: str, version: int = 0, finish: str = "stop") -> list[Completion]:
    ids = TOK.encode(text, add_special_tokens=False)
    return [Completion(ids, [-0.25] * len(ids), [version] * len(ids), finish)]


LIMITS = CallLimits(max_calls=8, budget=400, context=2000)
POLICY = CallPolicy(max_tokens=32, temperature=0.7, options={"top_p": 0.9})


def episode(limits: CallLimits = LIMITS) -> AgentEpisode:
    return AgentEpisode("ep7", {"prompt": "p"}, 1000, POLICY, limits)


async def served(engine, test, ep=None):
    """Run ``test(server, client, ep)`` against a started server with one open episode."""
    server = AgentServer(engine, TOK)
    url = await server.start()
    ep = ep or episode()
    client = openai.AsyncOpenAI(base_url=url, api_key=server.open(ep), timeout=20)
    try:
        return await test(server, client, ep)
    finally:
        await client.close()
        await server.close()


def run(engine, test, ep=None):
    return asyncio.run(asyncio.wait_for(served(engine, test, ep), 40))


def test_models_lists_the_policy_on_a_loopback_port():
    async def test(server, client, ep):
        assert server.base_url.startswith("http://127.0.0.1:") and server.base_url.endswith("/v1")
        models = await client.models.list()
        assert [m.id for m in models.data] == ["policy"]

    run(EngineCalls(ScriptedEngine()), test)


def test_a_tool_call_round_trip_extends_the_segment_with_the_runs_sampling():
    engine = ScriptedEngine(turn(CALL_TEXT, version=2), turn("3", version=3))

    async def test(server, client, ep):
        msgs = list(QUESTION)
        r = await client.chat.completions.create(
            model="policy", messages=msgs, tools=[CALC], temperature=0.1, seed=5
        )
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (tc,) = choice.message.tool_calls
        assert (tc.id, tc.type, tc.function.name) == ("call_ep7_0_0", "function", "calculate")
        assert json.loads(tc.function.arguments) == {"expression": "1+2"}
        assert r.usage.completion_tokens == len(turn(CALL_TEXT)[0].token_ids)
        msgs.append(choice.message)  # sent back as received (the client dumps the object)
        msgs.append({"role": "tool", "tool_call_id": tc.id, "content": "3"})
        r2 = await client.chat.completions.create(model="policy", messages=msgs, tools=[CALC])
        assert (r2.choices[0].message.content, r2.choices[0].finish_reason) == ("3", "stop")
        return ep

    ep = run(EngineCalls(engine), test)
    c1, c2 = engine.calls
    seg = ep.export("last")
    assert [c.kind for c in ep.calls] == ["first", "extend"] and len(ep.segments) == 1
    r = ChatRenderer(TOK, [CALC])
    ids1 = turn(CALL_TEXT)[0].token_ids
    delta = r.delta_ids([{"role": "tool", "content": "3"}], ids1)
    assert c1.prompt_ids == r.prompt_ids(QUESTION) and seg.traj.prompt_ids == c1.prompt_ids
    assert c2.prompt_ids == c1.prompt_ids + ids1 + delta
    assert seg.traj.versions == [2] * (len(ids1) + len(delta)) + [3]
    # the run's sampling, the episode's seeds; what was asked otherwise is counted
    assert (c1.temperature, c1.options, c1.max_tokens) == (0.7, {"top_p": 0.9}, 32)
    assert (c1.seed, c2.seed) == (1000, 1001)
    assert ep.calls[0].overrides == {"temperature": 0.1, "seed": 5}
    assert (ep.calls[0].tool_calls, ep.calls[0].malformed) == (1, 0)


def test_wrong_and_ended_keys_are_authentication_errors():
    async def test(server, client, ep):
        wrong = client.with_options(api_key="sk-asyncrl-not-a-key")
        with pytest.raises(openai.AuthenticationError) as e:
            await wrong.chat.completions.create(model="policy", messages=QUESTION)
        assert e.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            await wrong.models.list()
        assert server.end(ep.id, "done") is ep and ep.end == "done"
        with pytest.raises(openai.AuthenticationError) as e:
            await client.chat.completions.create(model="policy", messages=QUESTION)
        assert e.value.code == "episode_ended" and "episode_ended: done" in str(e.value)
        assert server.counts.refused == {"bad_key": 2, "ended": 1}

    run(EngineCalls(ScriptedEngine()), test)


def test_refused_requests_name_the_field_and_a_spent_budget_ends_the_episode():
    engine = ScriptedEngine(turn("12345"))

    async def test(server, client, ep):
        for kwargs, param in (
            ({"n": 2}, "n"),
            ({"logprobs": True, "top_logprobs": 2}, "top_logprobs"),
        ):
            with pytest.raises(openai.BadRequestError) as e:
                await client.chat.completions.create(model="policy", messages=QUESTION, **kwargs)
            assert e.value.param == param
        image = [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
        with pytest.raises(openai.BadRequestError) as e:
            await client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": image}]
            )
        assert e.value.param == "messages[0].content[0]"
        r = await client.chat.completions.create(model="other", messages=QUESTION)
        assert r.choices[0].finish_reason == "length" and r.model == "policy"
        assert engine.calls[0].max_tokens == 5  # the budget left
        with pytest.raises(openai.BadRequestError) as e:
            await client.chat.completions.create(model="policy", messages=QUESTION)
        assert e.value.code == "budget_exhausted" and ep.end == "max_tokens"
        with pytest.raises(openai.AuthenticationError) as e:  # its key is revoked
            await client.chat.completions.create(model="policy", messages=QUESTION)
        assert "max_tokens" in str(e.value)
        assert server.counts.model_other == 1
        assert server.counts.refused == {
            "n": 1,
            "top_logprobs": 1,
            "messages[0].content[0]": 1,
            "budget_exhausted": 1,
            "ended": 1,
        }

    engine.rounds[0][0].finish_reason = "length"
    run(EngineCalls(engine), test, episode(CallLimits(8, 5, 2000)))


def test_a_streamed_reply_is_the_whole_reply_as_chunks_and_extends_when_sent_back():
    """``stream: true``: the chunks carry the reply the plain body would (text, tool calls,
    finish reason, the sampled log-probs, usage when asked); the reply the ``openai``
    client's stream accumulator builds from them, sent back, extends its segment as a plain
    reply does."""
    engine = ScriptedEngine(*[turn(CALL_TEXT, version=2)] * 2, turn("3", version=3))

    async def test(server, client, ep):
        stream = await client.chat.completions.create(
            model="policy", messages=QUESTION, tools=[CALC], stream=True, logprobs=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = [c async for c in stream]
        assert {c.object for c in chunks} == {"chat.completion.chunk"}
        assert len({c.id for c in chunks}) == 1 and chunks[-1].choices == []
        assert chunks[-1].usage.completion_tokens == len(turn(CALL_TEXT)[0].token_ids)
        deltas = [c.choices[0] for c in chunks if c.choices]
        assert [d.finish_reason for d in deltas] == [None, None, "tool_calls"]
        assert deltas[0].delta.role == "assistant" and deltas[0].delta.content is None
        lps = deltas[0].logprobs.content
        assert [t.logprob for t in lps] == [-0.25] * len(turn(CALL_TEXT)[0].token_ids)
        assert "".join(t.token for t in lps) == TOK.decode(turn(CALL_TEXT)[0].token_ids)
        (tc,) = deltas[1].delta.tool_calls
        assert (tc.index, tc.id, tc.function.name) == (0, "call_ep7_0_0", "calculate")
        async with client.chat.completions.stream(  # the client's own accumulator
            model="policy", messages=QUESTION, tools=[CALC]
        ) as s:
            final = await s.get_final_completion()
        reply = final.choices[0].message
        assert reply.tool_calls[0].function.arguments == tc.function.arguments
        msgs = [*QUESTION, reply, {"role": "tool", "tool_call_id": tc.id, "content": "3"}]
        stream = await client.chat.completions.create(
            model="policy", messages=msgs, tools=[CALC], stream=True
        )
        chunks = [c async for c in stream]
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == "3"
        assert chunks[-1].choices[0].finish_reason == "stop" and chunks[-1].usage is None
        assert server.counts.streamed == 3
        return ep

    ep = run(EngineCalls(engine), test)
    assert [c.kind for c in ep.calls] == ["first", "new", "extend"]  # the same question twice
    assert ep.export("last").calls == [1, 2]  # the second call's chain: extended


def test_an_episodes_end_cancels_its_call_in_flight():
    hanging = HangingCalls()

    async def test(server, client, ep):
        call = asyncio.ensure_future(
            client.chat.completions.create(model="policy", messages=QUESTION)
        )
        await hanging.started.wait()
        assert len(ep.inflight) == 1
        server.end(ep.id, "agent_timeout")
        with pytest.raises(openai.AuthenticationError) as e:
            await call
        assert "agent_timeout" in str(e.value)
        assert hanging.cancelled == 1 and not ep.inflight
        assert ep.calls[0].finish_reason == "abort" and ep.export() is None

    run(hanging, test)


def test_the_endpoint_binds_to_loopback_only():
    with pytest.raises(ValueError, match="loopback"):
        ServerOptions(bind="0.0.0.0")
    with pytest.raises(ValueError, match="loopback"):
        ServerOptions(bind="localhost")
    assert ServerOptions(bind="::1").bind == "::1"
    with pytest.raises(ValueError, match="hermes"):
        ServerOptions(tool_parser="nope")


def test_a_malformed_call_stays_in_the_content_and_is_counted():
    bad = "<tool_call>{not json}</tool_call>"
    engine = ScriptedEngine(turn(bad), turn(CALL_TEXT))

    async def test(server, client, ep):
        r = await client.chat.completions.create(model="policy", messages=QUESTION, tools=[CALC])
        assert (r.choices[0].message.content, r.choices[0].finish_reason) == (bad, "stop")
        assert r.choices[0].message.tool_calls is None
        r = await client.chat.completions.create(
            model="policy", messages=QUESTION, tools=[CALC], tool_choice="none"
        )
        assert r.choices[0].message.content == CALL_TEXT  # not parsed when told none
        assert [(c.tool_calls, c.malformed) for c in ep.calls] == [(0, 1), (0, 0)]
        assert [c.kind for c in ep.calls] == ["first", "new"]

    run(EngineCalls(engine), test)


def test_keys_resolve_by_hash_and_ended_ones_are_remembered_up_to_the_bound():
    from asyncrl.actors.agents.keys import PREFIX, EndedKey, Keys, UnknownKey, key_hash

    keys = Keys(ended=2)
    minted = [keys.mint(f"e{i}") for i in range(3)]
    key, h = minted[0]
    assert key.startswith(PREFIX) and len(key) > len(PREFIX) + 40 and h == key_hash(key)
    assert key not in repr(vars(keys))  # only hashes are kept
    assert keys.resolve(key) == "e0"
    for i, (_, h) in enumerate(minted):
        keys.revoke(h, f"end{i}")
    keys.revoke(minted[2][1], "later")  # the first end stays
    with pytest.raises(EndedKey, match="end2"):
        keys.resolve(minted[2][0])
    with pytest.raises(UnknownKey):  # the oldest ended key is forgotten
        keys.resolve(minted[0][0])
    assert len(keys.ended) == 2 and not keys.live


def test_a_taken_port_fails_the_start_and_leaves_nothing_open():
    async def test():
        first = AgentServer(EngineCalls(ScriptedEngine()), TOK)
        url = await first.start()
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        second = AgentServer(EngineCalls(ScriptedEngine()), TOK, ServerOptions(port=port))
        try:
            with pytest.raises(OSError):
                await second.start()
            assert second._runner is None
        finally:
            await first.close()

    asyncio.run(asyncio.wait_for(test(), 20))


def test_a_completion_that_finishes_as_its_episode_ends_is_not_recorded():
    class EndsFirst:
        """Answers, and the episode ends right after: before the endpoint's handler resumes
        (the call in flight is done by then: nothing left to cancel)."""

        server: AgentServer

        async def complete(self, call):
            asyncio.get_running_loop().call_soon(self.server.end, "ep7", "agent_timeout")
            return turn("3")[0]

    engine = EndsFirst()

    async def test():
        server = engine.server = AgentServer(engine, TOK)
        url = await server.start()
        ep = episode()
        client = openai.AsyncOpenAI(base_url=url, api_key=server.open(ep), timeout=20)
        try:
            with pytest.raises(openai.AuthenticationError, match="agent_timeout"):
                await client.chat.completions.create(model="policy", messages=QUESTION)
        finally:
            await client.close()
            await server.close()
        return ep

    ep = asyncio.run(asyncio.wait_for(test(), 20))
    assert ep.calls[0].finish_reason == "abort" and ep.export() is None
    assert ep.tokens == 0 and not ep.segments[0].busy
