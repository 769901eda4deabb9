"""Agent episodes end to end inside one actor (asyncrl/actors/agents/runner.py): real agent
worker processes (tests/fakes/agents.py ``plays``, each prompt naming its part) calling the
real ``AgentServer`` with the plain ``openai`` client, over a scripted policy and the demo
tokenizer, through ``EpisodeGroups`` as an actor runs them.

What is checked: each way an episode ends gives its end and its reward (the agent's, None ->
the task's reward_fn, 0 for a failure, a placeholder for no call); a group of n episodes is n
samples seeded as ``run_episode``'s; ``AgentCounts`` holds the ends, the causes and the
endpoint's counts; a spent budget, a worker's death and an agent failing too often; and an
actor's ``GroupMaker`` wired for ``episode.agent`` on the simulated engine."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

pytest.importorskip("openai", reason="openai comes with vLLM; install vllm to run")
pytest.importorskip("aiohttp", reason="aiohttp comes with vLLM; install vllm to run")

from asyncrl.actors.agents.agent_worker import AGENT_WORKER  # noqa: E402
from asyncrl.actors.agents.policy import CallPolicy  # noqa: E402
from asyncrl.actors.agents.record import EXPORT_MODES, CallLimits  # noqa: E402
from asyncrl.actors.agents.runner import AgentCounts, AgentRun  # noqa: E402
from asyncrl.actors.agents.server import AgentServer  # noqa: E402
from asyncrl.actors.data.prompt import Prompt  # noqa: E402
from asyncrl.actors.engine.completions import Completion  # noqa: E402
from asyncrl.actors.episodes.env_pool import EnvPool  # noqa: E402
from asyncrl.actors.episodes.failures import EnvFailureRate, FailureGuard  # noqa: E402
from asyncrl.actors.episodes.group import EpisodeGroups  # noqa: E402
from asyncrl.actors.rewards.calls import Scored  # noqa: E402
from asyncrl.core.config.episode import AGENT_EXPORTS  # noqa: E402
from asyncrl.orchestration.demo.tokenizer import build_tokenizer  # noqa: E402
from tests.fakes.agents import spec_of  # noqa: E402
from tests.fakes.engines import Call, EngineCalls  # noqa: E402

pytestmark = pytest.mark.timeout(60)

TOK = build_tokenizer()
EOS = TOK.eos_token_id
QUESTION = [{"role": "user", "content": "what is 1+2?"}]
CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "%s"}}</tool_call>'
POLICY = CallPolicy(max_tokens=100, temperature=0.7)
LIMITS = CallLimits(max_calls=3, budget=400, context=2000)


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")  # the test's own client calls too


class Model:
    """A scripted policy: a sum question (``what is A+B?``) is answered with the sum, or with
    a calculator call when the prompt offers tools; a tool's answer is repeated; ``again``
    gets ``ok``; a question with ``long`` runs to ``max_tokens`` (``length``). Every reply
    ends with EOS, at version 3; ``calls`` records each request."""

    version = 3

    def __init__(self) -> None:
        self.calls: list[Call] = []

    async def generate(self, prompt_ids, n, max_tokens, temperature=1.0, seed=None, **options):
        self.calls.append(Call(list(prompt_ids), n, max_tokens, temperature, seed, options))
        text = TOK.decode(prompt_ids)
        last = text.rstrip().removesuffix("assistant:").rstrip().splitlines()[-1]
        role, _, content = last.partition(": ")
        await asyncio.sleep(0.01)
        if "long" in content:
            ids = TOK.encode("a" * max_tokens, add_special_tokens=False)[:max_tokens]
            return [Completion(ids, [-0.5] * len(ids), [3] * len(ids), "length")]
        expr = content.removeprefix("what is ").rstrip("?")
        if role == "tool" or content == "again":
            out = "ok" if content == "again" else content
        else:
            a, b = expr.split("+")
            out = CALL % expr if "<tools>" in text else str(int(a) + int(b))
        ids = TOK.encode(out, add_special_tokens=False) + [EOS]
        return [Completion(ids, [-0.5] * len(ids), [3] * len(ids), "stop")]


async def score_all(prompt, texts, fields):
    return [Scored(float(t == fields["answer"]), "", "", "", {}) for t in texts]


def prompt(part: str, index: int = 0, question: str = "what is 1+2?", **fields) -> Prompt:
    messages = [{"role": "user", "content": question}]
    text = f"user: {question}\nassistant: "
    return Prompt(index, text, {"part": part, "answer": "3", **fields}, messages=messages)


@dataclasses.dataclass
class Setup:
    """The parts of one test: the policy behind the endpoint, the run and its groups, and
    what was told."""

    model: Model
    run: AgentRun
    groups: EpisodeGroups
    told: list[str]


async def with_agents(test, limits=LIMITS, workers=2, timeout_s=3.0, guard=None):
    """``test(setup)`` with a started endpoint and an agent pool; both closed after."""
    model = Model()
    server = AgentServer(EngineCalls(model), TOK)
    await server.start()
    pool = EnvPool(spec_of("plays"), workers=workers, timeout_s=timeout_s, module=AGENT_WORKER)
    told: list[str] = []
    run = AgentRun(server, pool, POLICY, limits, AgentCounts(server.counts), say=told.append)
    groups = EpisodeGroups(
        pool, None, None, score_all, lambda: 3, EOS, say=told.append, guard=guard, runner=run
    )
    try:
        return await test(Setup(model, run, groups, told))
    finally:
        await server.close()
        await pool.shutdown()


def drive(test, **kw):
    return asyncio.run(asyncio.wait_for(with_agents(test, **kw), 50))


async def one_each(s: Setup, prompts: list[Prompt]):
    """One episode of each prompt, all at once: ``[(episode, sample)]``."""
    runs = [s.groups.run(p, f"g{i}", 1000 * i, 1) for i, p in enumerate(prompts)]
    return [(es[0], ss[0]) for es, ss in await asyncio.gather(*runs)]


ENDS = [  # part, its fields -> end, reward, whether the sample holds tokens
    ("answers", {"result": None}, "done", 1.0, True),  # None: reward_fn scored "3"
    ("answers", {"result": {"score": 0.25, "calls": 1}}, "done", 0.25, True),
    ("answers", {"result": 0.5, "question": "what is long?"}, "length", 0.5, True),
    ("uses_tools", {}, "done", 1.0, True),
    ("until_refused", {"result": 0.5}, "max_turns", 0.5, True),
    ("until_refused", {"reraise": True}, "max_turns", 0.0, True),
    ("calls_then_raises", {}, "agent_error", 0.0, True),
    ("raises", {}, "agent_error", 0.0, False),
    ("bad_value", {"value": "x"}, "agent_error", 0.0, False),
    ("returns_float", {}, "no_call", 0.0, False),
    ("hangs", {}, "agent_timeout", 0.0, False),
]


def test_each_way_an_agent_episode_ends_gives_its_end_and_reward():
    prompts = [prompt(part, i, **fields) for i, (part, fields, *_) in enumerate(ENDS)]

    async def test(s: Setup):
        return await one_each(s, prompts), s.run.counts.to_dict(), s.groups.counts

    got, counts, episodes = drive(test)
    for (part, _, end, reward, tokens), (e, sample) in zip(ENDS, got, strict=True):
        assert (sample.episode_end, sample.reward) == (end, reward), (part, e.error)
        assert (e.trajectory is not None) == tokens, part
        if not tokens:  # a placeholder: one EOS that trains nothing
            assert (sample.completion_ids, sample.loss_mask, sample.token_versions) == (
                [EOS],
                [0],
                [3],
            )
    by_part = {f"{p}{i}": pair for i, ((p, *_), pair) in enumerate(zip(ENDS, got, strict=True))}
    assert by_part["answers1"][1].reward_extras == {"calls": 1.0}  # the dict's other numbers
    tools_e, tools_s = by_part["uses_tools3"]
    assert (tools_s.turns, tools_s.tool_calls, tools_s.tool_errors) == (2, 1, 0)
    assert tools_s.completion_ids[-2:] == TOK.encode("3", add_special_tokens=False) + [EOS]
    assert tools_e.last_answer == "3" and tools_e.trajectory.messages[-1]["content"] == "3"
    assert by_part["until_refused4"][1].turns == 3  # max_calls, then refused
    assert "the agent broke after its first call" in by_part["calls_then_raises6"][0].error
    assert by_part["returns_float9"][0].error.startswith("the agent returned 0.75 without")
    assert counts["ends"] == {
        "done": 3,
        "length": 1,
        "max_turns": 2,
        "agent_error": 3,
        "no_call": 1,
        "agent_timeout": 1,
    }
    assert counts["causes"] == {"raised": 2, "bad_return": 1, "no_call": 1, "timeout": 1}
    assert len(counts["reasons"]) == 5 and counts["episodes"] == len(ENDS)
    assert counts["calls"] == {"first": 7, "extend": 5} and counts["refused"] == {"max_calls": 2}
    assert (counts["segments"], counts["segments_dropped"], counts["tool_calls"]) == (7, 0, 1)
    assert episodes.failures == 5 and episodes.episodes == len(ENDS)


def test_a_group_of_n_episodes_is_n_samples_seeded_as_run_episodes_are():
    async def test(s: Setup):
        _, samples = await s.groups.run(prompt("uses_tools"), "g", 500, 4)
        val = s.groups.with_runner(s.run.with_policy(CallPolicy(100, 0.0)))
        _, greedy = await val.run(prompt("uses_tools"), "v", 7, 1)
        return samples, greedy, s.run.counts.to_dict(), s.groups.counts, val.counts

    samples, greedy, counts, train, val = drive(test)
    assert len(samples) == 4 and all(x.prompt_ids == samples[0].prompt_ids for x in samples)
    assert [x.reward for x in samples] == [1.0] * 4 and greedy[0].reward == 1.0
    for x in samples:
        assert set(x.token_versions) == {3} and sum(x.loss_mask) == x.model_tokens
    assert train.ends == {"done": 4} and val.ends == {"done": 1}  # counted apart
    assert counts["ends"] == {"done": 5} and counts["calls"] == {"first": 5, "extend": 5}
    assert counts["overridden"] == {} and counts["tool_calls"] == 5


def test_calls_carry_the_episode_seeds_and_the_runs_sampling():
    async def test(s: Setup):
        await s.groups.run(prompt("uses_tools"), "g", 500, 2)
        val = s.groups.with_runner(s.run.with_policy(CallPolicy(100, 0.0)))
        await val.run(prompt("answers", result=1.0), "v", 7, 1)
        return s.model.calls

    calls = drive(test)
    train, greedy = calls[:4], calls[4:]
    assert sorted(c.seed for c in train) == [500, 501, 500 + 1009, 501 + 1009]
    assert {(c.temperature, c.max_tokens) for c in train} == {(0.7, 100)}
    assert [(c.seed, c.temperature) for c in greedy] == [(7, 0.0)]


def test_a_spent_budget_ends_the_episode_as_max_tokens_with_the_agents_reward():
    question = "what is 1+2?" + " 0" * 600  # its prompt does not fit the context
    prompts = [prompt("until_refused", 0, result=0.5), prompt("until_refused", 1, question)]

    async def test(s: Setup):
        return await one_each(s, prompts), s.run.counts.to_dict()

    got, counts = drive(test, limits=CallLimits(max_calls=8, budget=5, context=800))
    (e, sample), (too_long, placeholder) = got
    assert (sample.episode_end, sample.reward, sample.turns) == ("max_tokens", 0.5, 1)
    assert e.error == "" and e.last_answer == "3"
    assert (placeholder.episode_end, placeholder.loss_mask, too_long.trajectory) == (
        "max_tokens",
        [0],
        None,
    )
    assert counts["refused"] == {"budget_exhausted": 1, "context_length_exceeded": 1}
    assert counts["causes"] == {}  # a budget's end is no failure


def test_a_worker_that_dies_ends_its_episode_as_an_agent_error():
    async def test(s: Setup):
        first = await one_each(s, [prompt("exits")])
        later = await one_each(s, [prompt("answers", result=1.0)])  # a new worker serves
        return first + later, s.run.counts.to_dict()

    got, counts = drive(test, workers=1)
    (dead, sample), (_, ok) = got
    assert (sample.episode_end, ok.episode_end) == ("agent_error", "done")
    assert "died: exit code 3" in dead.error and counts["causes"] == {"crashed": 1}


def test_an_agent_that_keeps_failing_fails_the_run_naming_it():
    guard = FailureGuard(0.5, 4, f"episode.agent={spec_of('plays')}")

    async def test(s: Setup):
        await s.groups.run(prompt("returns_float"), "g0", 0, 2)  # 2 of 4: not more than half
        with pytest.raises(EnvFailureRate) as e:
            await s.groups.run(prompt("returns_float"), "g1", 0, 1)
        return str(e.value), s.told

    text, told = drive(test, guard=guard)
    assert text.startswith(f"the agent (episode.agent={spec_of('plays')}) ended 3 of the last 4")
    assert "with agent_error/agent_timeout/no_call" in text and "first: no_call: " in text
    assert "raise episode.agent_timeout_s" in text
    assert told[0].startswith("episode no_call (1 of 1 so far): the agent returned 0.75")


def test_the_first_call_asking_for_each_overridden_parameter_is_told_once():
    asks = {"temperature": 0.1, "presence_penalty": 0.5}

    async def test(s: Setup):
        for i in range(2):
            await s.groups.run(prompt("answers", result=1.0, create=asks), f"g{i}", 0, 1)
        return s.told, s.run.counts.to_dict()["overridden"], s.model.calls

    told, overridden, calls = drive(test)
    assert overridden == {"temperature": 2, "presence_penalty": 2}
    assert [t.split(";")[0] for t in told] == [
        "an agent call asked for temperature=0.1",
        "an agent call asked for presence_penalty=0.5",
    ]
    assert {(c.temperature, tuple(c.options)) for c in calls} == {(0.7, ())}


@pytest.mark.parametrize("export", ["all", "last"])
def test_all_trains_every_call_chain_as_a_part_sharing_the_episodes_reward(export):
    """A sub-agent's call (a conversation of its own, offered the calculator too, so its
    prompt opens as the main chain's), then the main chain (a tool call and its answer):
    under ``all`` both chains are samples, the main one (holding the last call) first, the
    sub-agent's as its part 1 with the same reward; under ``last`` one is."""

    async def test(s: Setup):
        s.run.export = export
        p = prompt("with_subagent", sub_tools=True)
        episodes, samples = await s.groups.run(p, "g", 0, 2)
        return episodes, samples, s.run.counts.to_dict(), s.groups.counts

    episodes, samples, counts, episode_counts = drive(test)
    assert counts["calls"] == {"first": 2, "new": 2, "extend": 2}
    assert counts["segments"] == 4 and all(x.prompt_ids == samples[0].prompt_ids for x in samples)
    if export == "last":
        assert [x.part for x in samples] == [0, 0] and counts["segments_dropped"] == 2
        return
    assert [x.part for x in samples] == [0, 1, 0, 1] and counts["segments_dropped"] == 0
    assert (episode_counts.parts, episode_counts.parts_dropped) == (2, 0)
    assert [x.reward for x in samples] == [1.0] * 4
    assert [(x.turns, x.tool_calls, x.episode_end) for x in samples[:2]] == [
        (2, 1, "done"),
        (1, 1, "done"),
    ]
    sub = samples[1]
    lead = sub.loss_mask.index(1)  # its own prompt beyond the group's, masked
    assert "2+2" in TOK.decode(sub.completion_ids[:lead])
    assert "2+2" in TOK.decode(sub.completion_ids[lead:])  # its calculator call
    assert len(episodes) == 2 and len(episodes[0].others) == 1


def test_a_chain_sharing_no_first_token_with_the_group_is_dropped_and_counted():
    """The demo template opens a prompt with tools with ``<tools>``: a sub-agent called
    without them shares no token with the group's prompt, so its chain is not trained."""

    async def test(s: Setup):
        s.run.export = "all"
        _, samples = await s.groups.run(prompt("with_subagent"), "g", 0, 2)
        return samples, s.groups.counts, s.told

    samples, counts, told = drive(test)
    assert [x.part for x in samples] == [0, 0] and [x.reward for x in samples] == [1.0, 1.0]
    assert (counts.parts, counts.parts_dropped) == (0, 2)
    assert told == [
        "1 call chain(s) of agent episodes not trained so far: their prompts share no first "
        "token with their group's (a sub-agent rendered through another chat template?); "
        "counted as episodes.parts_dropped"
    ]


def test_the_configs_export_modes_are_the_records():
    assert AGENT_EXPORTS == EXPORT_MODES
