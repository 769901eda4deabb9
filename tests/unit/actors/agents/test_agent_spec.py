"""Loading and calling the agent a user writes (asyncrl/actors/agents/spec.py), in process:
a function or a class per episode, only the keywords it names, sync ones in a thread; a bad
signature refused at load naming the spec, the signature found and the fix; what an agent
returns checked by the reward functions' own rule (``rewards.calls.check_score``)."""

from __future__ import annotations

import asyncio
import math
import threading

import pytest

from asyncrl.actors.agents.spec import (
    KEYWORDS,
    AgentResult,
    AgentReturnError,
    accepted,
    call_agent,
    check_result,
    load_agent,
)
from asyncrl.actors.rewards.calls import score_call
from tests.fakes.agents import spec_of

BAD = """
def no_keys(row): ...
def positional_only(row, base_url, api_key, /): ...
def needs_more(row, *, base_url, api_key, tools): ...
class NoRun:
    pass
class RunWithoutKeys:
    def run(self, row): ...
class Strict:
    def __init__(self, level: int): ...
    def run(self, row, *, base_url, api_key): ...
NUMBER = 3
"""


def call(spec: str, kwargs: dict | None = None, row: dict | None = None):
    """Load ``spec``, make one episode's agent, run it; what it returned (unchecked)."""
    agent = load_agent(spec, kwargs)
    fn = agent.runner(agent.make())
    return asyncio.run(call_agent(fn, row or {"prompt": "p"}, "http://h/v1", "sk-k", "policy"))


def test_a_function_gets_only_the_keywords_it_names():
    def named(row, *, base_url, api_key): ...
    def everything(row, **kw): ...
    def with_model(row, base_url, api_key, model, other=1): ...

    assert accepted(named) == ("base_url", "api_key")
    assert accepted(everything) == accepted(with_model) == KEYWORDS
    seen = asyncio.run(call_agent(lambda row, **kw: (row, kw), {"a": 1}, "u", "k", "m"))
    assert seen == ({"a": 1}, {"base_url": "u", "api_key": "k", "model": "m"})
    assert call(spec_of("returns_float")) == 0.75
    assert call(spec_of("returns_dict"))["calls"] == 2  # named base_url, api_key: no model


def test_a_sync_agent_runs_in_a_thread_and_an_async_one_on_the_loop():
    out = call(spec_of("sync_agent"))
    assert out["in_thread"] is True and out["score"] == 0.5
    on_loop = []

    async def agent(row, *, base_url, api_key):
        on_loop.append(threading.current_thread() is threading.main_thread())

    asyncio.run(call_agent(agent, {}, "u", "k", "m"))
    assert on_loop == [True]


def test_a_class_is_made_per_episode_with_agent_kwargs_and_closed_if_it_can():
    agent = load_agent(spec_of("Counter"), {"start": 10})
    first, second = agent.make(), agent.make()
    assert first is not second and agent.is_class
    outs = [
        asyncio.run(call_agent(agent.runner(first), {}, "u", "k", "m")),
        asyncio.run(call_agent(agent.runner(first), {}, "u", "k", "m")),
        asyncio.run(call_agent(agent.runner(second), {}, "u", "k", "m")),
    ]
    assert outs == [11.0, 12.0, 11.0]
    assert agent.closer(first) == first.close
    assert load_agent(spec_of("returns_float")).closer(None) is None


def test_a_functions_agent_kwargs_are_extra_keywords_and_the_endpoints_are_reserved():
    assert call(spec_of("with_extra"), {"bonus": 0.25}) == 0.25
    with pytest.raises(ValueError, match=r"agent_kwargs names \['api_key'\], which the endpoint"):
        load_agent(spec_of("with_extra"), {"bonus": 1, "api_key": "x"})
    with pytest.raises(ValueError, match="missing a required argument: 'bonus'"):
        load_agent(spec_of("with_extra"))


@pytest.mark.parametrize(
    "name, kwargs, expected",
    [
        (
            "no_keys",
            {},
            "no_keys (FILE:2) has the signature (row), but an agent is called as fn(row, "
            "base_url=..., api_key=..., model=...) ('model' only if named), and it does not take "
            "base_url and api_key by keyword; define it as 'async def no_keys(row, *, base_url, "
            "api_key, model)' (or 'def': it runs in a thread; 'model' may be left out)",
        ),
        ("positional_only", {}, "does not take base_url and api_key by keyword; define it as"),
        ("needs_more", {}, "(missing a required argument: 'tools'); define it as"),
        ("NoRun", {}, "class NoRun has no run method; give it 'async def run(self, row, *,"),
        ("RunWithoutKeys", {}, "RunWithoutKeys.run (FILE:8) has the signature (row), but"),
        ("Strict", {"levle": 1}, "Strict(level: int) cannot take episode.agent_kwargs="),
        ("NUMBER", {}, "names a int, not a function or a class; define 'async def NUMBER(row"),
        ("missing", {}, "has no attribute 'missing'; define 'async def missing(row, *,"),
    ],
)
def test_a_bad_agent_is_refused_at_load_naming_the_spec_the_signature_and_the_fix(
    tmp_path, name, kwargs, expected
):
    path = tmp_path / "bad.py"
    path.write_text(BAD)
    with pytest.raises(ValueError) as e:
        load_agent(f"{path}:{name}", kwargs)
    assert str(e.value).startswith(f"agent spec '{path}:{name}'")
    assert expected.replace("FILE", str(path)) in str(e.value), str(e.value)


def test_a_malformed_spec_says_what_a_spec_looks_like():
    with pytest.raises(ValueError, match="expected 'package.module:Name' or 'path/to/file.py"):
        load_agent("no_colon")


@pytest.mark.parametrize(
    "value, expected",
    [
        (1.0, AgentResult(1.0)),
        (0, AgentResult(0.0)),
        (None, AgentResult(None)),
        (
            {"score": 0.5, "calls": 3, "ok": True, "why": "text"},
            AgentResult(0.5, {"calls": 3.0, "ok": 1.0}),
        ),
    ],
)
def test_an_agent_returns_a_number_a_dict_with_a_score_or_none(value, expected):
    assert check_result(value) == expected


@pytest.mark.parametrize(
    "value, kind",
    [
        (True, "wrong_type"),
        ("1.0", "wrong_type"),
        ([1.0], "wrong_type"),
        ({"value": 1.0}, "missing_score"),
        ({"score": None}, "wrong_type"),
        (math.nan, "non_finite"),
        ({"score": math.inf}, "non_finite"),
        (1e9, "out_of_range"),
    ],
)
def test_a_bad_return_is_refused_by_the_reward_functions_rule(value, kind):
    with pytest.raises(AgentReturnError) as e:
        check_result(value, "agent a.py:f")
    assert e.value.kind == kind
    assert str(e.value).startswith(f"{kind}: agent a.py:f returned ")
    assert str(e.value).endswith("or None to have the task's reward_fn score the last answer")
    scored = score_call(lambda prompt, completion: value, "p", "c")  # one rule for both
    assert (scored.kind, scored.value) == (kind, 0.0)
