"""The episode runner and the multi-turn group: on the demo tokenizer's chat template, a
scripted engine and a scripted environment host (tests/fakes/envs.py), with no process.

What is checked: the response is the sampled tokens plus the template's, with the mask on the
model's only; each token keeps the version that sampled it across a weight update between
turns; tool calls are answered and counted; every limit and environment failure ends the
episode with its own reason; a group's samples carry all of it."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.actors.data.prompt import Prompt
from asyncrl.actors.engine.vllm_engine import Completion
from asyncrl.actors.episodes.activity import Activity, CountedHost
from asyncrl.actors.episodes.env import StepResult
from asyncrl.actors.episodes.failures import EnvFailureRate, FailureGuard
from asyncrl.actors.episodes.group import EpisodeGroups
from asyncrl.actors.episodes.render import ChatRenderer
from asyncrl.actors.episodes.runner import Limits, Turn, run_episode
from asyncrl.actors.episodes.tool_calls import get_parser
from asyncrl.actors.rewards.calls import Scored
from asyncrl.orchestration.demo.tokenizer import build_tokenizer
from tests.fakes.envs import ScriptedHost

TOK = build_tokenizer()
EOS = TOK.eos_token_id
Q1 = {"role": "user", "content": "what is 12+5?"}
Q2 = {"role": "user", "content": "what is 17+3?"}


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


class Model:
    """A scripted model: ``answers`` maps the last line of the prompt's last message to the
    text it answers (then EOS); ``version`` is the weights' version, ``cut`` answers with
    ``finish_reason="length"``."""

    def __init__(self, answers: dict[str, str], version: int = 3, cut: bool = False):
        self.answers, self.version, self.cut = answers, version, cut
        self.prompts: list[str] = []

    async def generate(self, ids: list[int], max_tokens: int, seed: int) -> Completion:
        text = TOK.decode(ids)
        self.prompts.append(text)
        last = text.rstrip().removesuffix("assistant:").rstrip().splitlines()[-1]
        out = TOK.encode(self.answers[last.split(": ", 1)[1]])
        out = out[:max_tokens] if self.cut else out + [EOS]
        reason = "length" if self.cut else "stop"
        await asyncio.sleep(0)
        return Completion(out, [-0.5] * len(out), [self.version] * len(out), reason)


def turn(model: Model) -> Turn:
    renderer = lambda schemas: ChatRenderer(  # noqa: E731 (the demo alphabet has no capitals)
        TOK, schemas, tools_section=lambda ts: "tools: add(a, b)"
    )
    decode = lambda ids: TOK.decode(ids, skip_special_tokens=True)  # noqa: E731
    return Turn(model.generate, decode, renderer, get_parser("hermes"))


LIMITS = Limits(max_turns=4, budget=200, turn_tokens=40, prompt_tokens=64)


def run(host, model, limits=LIMITS, episode_id="g:0"):
    return asyncio.run(run_episode(host, turn(model), limits, episode_id, {"a": 12}, 7))


def test_two_turns_keep_the_sampled_tokens_and_mask_the_templates():
    host = ScriptedHost([Q1], [StepResult([Q2], 0.5, False), StepResult([], 0.25, True)])
    model = Model({"what is 12+5?": "17", "what is 17+3?": "20"})
    e = run(host, model)
    t = e.trajectory
    assert (e.end, e.reward, e.finish_reason, t.turns, e.last_answer) == (
        "done",
        0.75,
        "stop",
        2,
        "20",
    )
    first, second = TOK.encode("17") + [EOS], TOK.encode("20") + [EOS]
    between = TOK.encode("\nuser: what is 17+3?\nassistant: ")
    assert TOK.decode(t.prompt_ids) == "user: what is 12+5?\nassistant: "
    assert t.ids == first + between + second
    assert t.mask == [1] * 3 + [0] * len(between) + [1] * 3
    assert t.logprobs == [-0.5] * 3 + [0.0] * len(between) + [-0.5] * 3
    # the model saw exactly the tokens trained: the second prompt is prompt + turn 1 + template
    assert model.prompts[1] == TOK.decode(t.prompt_ids + first + between)
    steps = [c for c in host.calls if c[0] == "step"]
    assert [c[2] for c in steps] == [
        {"role": "assistant", "content": "17"},
        {"role": "assistant", "content": "20"},
    ]
    assert host.calls[-1] == ("close", "g:0")


def test_each_token_keeps_the_version_that_sampled_it_across_a_weight_update():
    host = ScriptedHost([Q1], [StepResult([Q2], None, False), StepResult([], 1.0, True)])
    model = Model({"what is 12+5?": "17", "what is 17+3?": "20"}, version=4)
    real = model.generate

    async def updated_between_turns(ids, max_tokens, seed):
        out = await real(ids, max_tokens, seed)
        model.version = 5  # the learner's update lands after turn 1
        return out

    model.generate = updated_between_turns
    t = run(host, model).trajectory
    n_between = len(t.ids) - 6
    assert t.versions == [4] * 3 + [4] * n_between + [5] * 3  # template tokens copy turn 1's


def test_tool_calls_are_answered_counted_and_the_answer_scored_by_the_task():
    call = '<tool_call>{"name": "add", "arguments": {"a": 12, "b": 5}}</tool_call>'
    host = ScriptedHost([Q1], [StepResult([], None, True)], tools=[add])
    model = Model({"what is 12+5?": call, "17": "17"})
    e = run(host, model)
    assert (e.end, e.tool_calls, e.tool_errors, e.reward, e.last_answer) == (
        "done",
        1,
        0,
        None,
        "17",
    )
    assert TOK.decode(e.trajectory.prompt_ids).startswith("system: tools: add(a, b)\n")
    assert "\ntool: 17\nassistant: " in TOK.decode(e.trajectory.ids)


def test_activity_tells_an_episode_waiting_for_its_tools_from_one_at_the_engine():
    """Two episodes; each calls the tool (0.05 s) then answers: while both wait for the tool
    the actor would be ``waiting_env``, while either generates it is not; all counts end at 0."""
    call = '<tool_call>{"name": "add", "arguments": {"a": 12, "b": 5}}</tool_call>'
    activity = Activity()
    seen: list[tuple[int, int, bool]] = []
    activity.on_change = lambda: seen.append(
        (activity.generating, activity.env, activity.waiting_env)
    )
    host = CountedHost(
        ScriptedHost([Q1], [StepResult([], None, True)], [add], delay_s=0.05), activity
    )
    model = Model({"what is 12+5?": call, "17": "17"})

    async def counted(ids, max_tokens, seed):
        with activity.running("generating"):
            return await model.generate(ids, max_tokens, seed)

    t = turn(model)
    t = Turn(counted, t.decode, t.renderer, t.parse)

    async def both():
        return await asyncio.gather(
            *(run_episode(host, t, LIMITS, f"g:{j}", {}, j) for j in range(2))
        )

    episodes = asyncio.run(both())
    assert [e.end for e in episodes] == ["done", "done"]
    assert (activity.generating, activity.env, activity.waiting_env) == (0, 0, False)
    assert (0, 2, True) in seen  # both at their tool, none at the engine
    assert all(w == (env > 0 and gen == 0) for gen, env, w in seen)
    assert any(gen > 0 for gen, _, _ in seen) and max(env for _, env, _ in seen) == 2


def test_a_malformed_or_failing_tool_call_is_answered_with_its_error_and_counted():
    bad = (
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call><tool_call>{oops</tool_call>'
    )
    host = ScriptedHost([Q1], [StepResult([], 1.0, True)], tools=[add])
    model = Model({})
    model.generate = _answer_after_tools(model, bad, "17")  # whatever the errors say
    e = run(host, model, Limits(max_turns=4, budget=2000, turn_tokens=100, prompt_tokens=64))
    assert (e.tool_calls, e.tool_errors, e.end, e.reward) == (2, 2, "done", 1.0)
    assert (
        TOK.decode(e.trajectory.ids).count("\ntool: rror: ") == 2
    )  # no capitals in the demo alphabet


def _answer_after_tools(model: Model, first: str, then: str):
    async def generate(ids, max_tokens, seed):
        out = TOK.encode(first if not model.prompts else then) + [EOS]
        model.prompts.append(TOK.decode(ids))
        return Completion(out, [-0.1] * len(out), [1] * len(out), "stop")

    return generate


@pytest.mark.parametrize(
    "limits, cut, end",
    [
        (Limits(max_turns=1, budget=200, turn_tokens=40, prompt_tokens=64), False, "max_turns"),
        (Limits(max_turns=4, budget=20, turn_tokens=40, prompt_tokens=64), False, "max_tokens"),
        (Limits(max_turns=4, budget=200, turn_tokens=1, prompt_tokens=64), True, "length"),
        (Limits(max_turns=4, budget=200, turn_tokens=40, prompt_tokens=5), False, "env_error"),
    ],
)
def test_every_limit_ends_the_episode_with_its_reason(limits, cut, end):
    host = ScriptedHost([Q1], [StepResult([Q2], 0.5, False)] * 4)
    e = run(host, Model({"what is 12+5?": "17", "what is 17+3?": "20"}, cut=cut), limits)
    assert e.end == end
    if end == "max_tokens":  # the next messages would not fit: the episode stops before them
        assert e.trajectory.turns == 1 and e.trajectory.mask[-1] == 1
    if end == "env_error":  # the first prompt does not fit data.max_prompt_length
        assert e.trajectory is None and "data.max_prompt_length" in e.error


@pytest.mark.parametrize(
    "failure, end", [("timeout", "env_timeout"), ("error", "env_error"), ("crash", "env_error")]
)
def test_an_environment_that_fails_ends_its_episode_with_the_reason(failure, end):
    host = ScriptedHost([Q1], [StepResult([Q2], 0.5, False), failure])
    e = run(host, Model({"what is 12+5?": "17", "what is 17+3?": "20"}))
    assert (e.end, e.reward, e.trajectory.turns) == (end, 0.5, 2)
    assert f"scripted {failure} in step" in e.error
    assert host.calls[-1] == ("close", "g:0")


def scorer(calls: list):
    async def score_all(prompt, texts, fields):
        calls.append(list(texts))
        return [Scored(1.0 if t == "17" else 0.0, "", "", "", {}) for t in texts]

    return score_all


def test_a_group_holds_n_episodes_scored_by_the_environment_or_the_task():
    call = '<tool_call>{"name": "add", "arguments": {"a": 12, "b": 5}}</tool_call>'
    host = ScriptedHost([Q1], [StepResult([], None, True)], tools=[add], delay_s=0.05)
    model = Model({"what is 12+5?": call, "17": "17"}, version=9)
    scored: list = []
    groups = EpisodeGroups(host, turn(model), LIMITS, scorer(scored), lambda: 9, EOS)
    prompt = Prompt(0, "12+5=", {"a": 12, "b": 5})
    samples = asyncio.run(groups.samples(prompt, "s:0", 100, 3))
    assert scored == [["17", "17", "17"]]  # the three last answers, scored at once
    for s in samples:
        assert (s.reward, s.turns, s.tool_calls, s.tool_errors, s.episode_end) == (
            1.0,
            2,
            1,
            0,
            "done",
        )
        assert s.prompt_ids == samples[0].prompt_ids and sum(s.loss_mask) == s.model_tokens
        assert set(s.token_versions) == {9}
    assert groups.counts.to_dict()["ends"] == {"done": 3} and groups.counts.tool_calls == 3
    opened = sorted((c[1], c[2]["episode"], c[2]["group_id"]) for c in host.calls if c[0] == "open")
    assert opened == [("s:0:0", 0, "s:0"), ("s:0:1", 1, "s:0"), ("s:0:2", 2, "s:0")]


def test_an_episode_whose_reset_failed_is_a_placeholder_that_trains_nothing():
    host = ScriptedHost([Q1], fail_open="crash")
    groups = EpisodeGroups(host, turn(Model({})), LIMITS, scorer([]), lambda: 4, EOS)
    samples = asyncio.run(groups.samples(Prompt(0, "12+5=", {}), "s:1", 0, 2))
    for s in samples:
        assert (s.completion_ids, s.loss_mask, s.token_versions, s.reward) == ([EOS], [0], [4], 0.0)
        assert s.episode_end == "env_error"
    assert groups.counts.env_failures[0].startswith("env_error: reset: scripted crash")
    told: list[str] = []
    groups.say = told.append
    for i in range(12):  # the first 3 failures are told, then the 10th, 100th, ...
        asyncio.run(groups.samples(Prompt(0, "12+5=", {}), f"s:{i + 3}", 0, 1))
    assert [t.split(" (")[1].split(" of")[0] for t in told] == ["3", "10"]
    assert told[0].startswith("episode env_error (3 of 3 so far): reset: scripted crash")


def test_an_environment_that_keeps_failing_fails_the_run_naming_the_fix():
    host = ScriptedHost([Q1], fail_open="crash")
    guard = FailureGuard(0.5, 8, "episode.env=my_env.py:Broken")
    groups = EpisodeGroups(
        host, turn(Model({})), LIMITS, scorer([]), lambda: 4, EOS, say=lambda _: None, guard=guard
    )
    asyncio.run(groups.samples(Prompt(0, "12+5=", {}), "s:0", 0, 4))  # 4 of 8: not more than half
    with pytest.raises(EnvFailureRate) as err:
        asyncio.run(groups.samples(Prompt(0, "12+5=", {}), "s:1", 0, 1))
    text = str(err.value)
    assert "(episode.env=my_env.py:Broken) ended 5 of the last 8 episodes" in text
    assert "first: env_error: reset: scripted crash" in text
    assert "raise episode.max_env_failure_frac (1.0 = never fail" in text


def test_the_failure_guard_forgets_what_left_its_window_and_never_trips_at_one():
    guard = FailureGuard(0.5, 4, "x")
    for end in ["env_error", "env_timeout", "done", "done", "done", "env_error", "done"]:
        guard.add(end)  # never more than 2 failures among the last 4
    assert guard.first == "env_error" and guard.window.errors == 1
    never = FailureGuard(1.0, 2, "x")
    for _ in range(10):
        never.add("env_error", "boom")
    with pytest.raises(ValueError):
        FailureGuard(1.5, 4, "x")


def test_a_chat_prompt_reaches_the_environment_as_its_messages():
    host = ScriptedHost([Q1], [StepResult([], 1.0, True)])
    groups = EpisodeGroups(
        host, turn(Model({"what is 12+5?": "17"})), LIMITS, scorer([]), lambda: 0, EOS
    )
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "12+5?"}]
    prompt = Prompt(
        0, "system: be brief\nuser: 12+5?\nassistant: ", {"answer": "17"}, messages=chat
    )
    asyncio.run(groups.samples(prompt, "s:2", 0, 2))
    rows = [c[2] for c in host.calls if c[0] == "open"]
    assert [r["messages"] for r in rows] == [chat, chat] and rows[0]["answer"] == "17"
