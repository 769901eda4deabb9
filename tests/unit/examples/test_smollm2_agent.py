"""examples/smollm2_agent: the agent loads as ``episode.agent`` loads it, sends the tool
schema asyncrl's tool runner sends in experiment=smollm2_tools (so the two examples' prompts
are the same tokens), runs the calculator and scores the final answer. Its episodes through the
real endpoint on SmolLM2: tests/integration/test_smollm2.py."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from asyncrl.actors.agents.spec import load_agent
from asyncrl.actors.episodes.env import load_tools
from asyncrl.actors.episodes.tools import ToolBox
from asyncrl.core.config.load import load_config
from tests.unit.examples.test_smollm2_tools import REPO

SPEC = "examples/smollm2_agent/agent.py:agent"


@pytest.fixture(scope="module")
def example():
    """The agent's module, loaded by its spec from the repository root, as the config says."""
    here = os.getcwd()
    os.chdir(REPO)
    try:
        agent = load_agent(SPEC)
        tools = ToolBox(load_tools(["examples/smollm2_tools/tools.py:calculate"]))
    finally:
        os.chdir(here)
    return SimpleNamespace(**agent.target.__globals__), tools  # the module's names


def call(name: str, arguments: str) -> SimpleNamespace:
    """A reply's tool call as the openai client gives it (``.function.name/.arguments``)."""
    return SimpleNamespace(id="call_0", function=SimpleNamespace(name=name, arguments=arguments))


def test_the_experiment_is_smollm2_tools_with_the_agent_instead_of_the_tool_runner():
    agent, tools = (
        load_config(["experiment=smollm2_agent"]),
        load_config(["experiment=smollm2_tools"]),
    )
    assert agent.episode.agent == SPEC and agent.episode.tools == []
    assert agent.episode.max_turns == tools.episode.max_turns
    for section in ("model", "data", "learner", "sampling", "eval", "actor"):
        assert getattr(agent, section) == getattr(tools, section), section


def test_the_agent_sends_the_schema_the_tool_runner_sends(example):
    module, tools = example
    assert tools.schemas() == module.TOOLS
    assert load_config(["experiment=smollm2_agent"]).episode.max_turns == module.MAX_CALLS


@pytest.mark.parametrize(
    "name, arguments, content, failed",
    [
        ("calculate", '{"expression": "19 * 43"}', "817", False),
        (
            "calculate",
            '{"expression": "2 ** 100"}',
            "Error: the operator ** is not supported",
            True,
        ),
        ("calculate", '{"expression": ', "Error: ", True),  # not JSON
        ("calculate", '{"expr": "1+1"}', "Error: ", True),  # a wrong argument name
        ("search", '{"q": "x"}', "Error: there is no tool 'search'", True),
    ],
)
def test_the_agent_runs_its_tool_calls_and_answers_errors(
    example, name, arguments, content, failed
):
    module, _ = example
    got, got_failed = module.run_tool(call(name, arguments))
    assert got.startswith(content) and got_failed is failed


@pytest.mark.parametrize(
    "text, truth, reward",
    [("The answer is 817.", "817", 1.0), ("19 * 43 = 817", "817", 1.0),
     ("The answer is 62.", "817", 0.0), ("I cannot say.", "817", 0.0), (None, "817", 0.0),
     ("The answer is -12.", "-12", 1.0)],
)  # fmt: skip
def test_the_reward_is_the_last_number_against_the_ground_truth(example, text, truth, reward):
    module, _ = example
    assert module.score(text, truth) == reward
