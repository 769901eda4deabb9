"""The environment interface (asyncrl/actors/episodes/env.py): loading a class by spec, the
checks of what ``reset`` and ``step`` return (each error names the environment and the fix),
and the built-in ``ToolsOnly``."""

from __future__ import annotations

import math

import pytest

from asyncrl.actors.episodes.env import (
    TOOLS_ONLY,
    StepResult,
    ToolsOnly,
    check_messages,
    check_step_result,
    load_environment,
    load_tools,
)

ENV_FILE = '''
from __future__ import annotations
from dataclasses import dataclass

@dataclass
class Config:  # a dataclass with string annotations: its module must be in sys.modules
    turns: int = 2

class Maze:
    def reset(self, row):
        return row["prompt"]

    def step(self, message):
        return [], 1.0, True, {}

class NoStep:
    def reset(self, row):
        return "hi"

def helper(x: int) -> int:
    """Double.

    Args:
        x: A number.
    """
    return 2 * x

maze = Maze()
'''


@pytest.fixture
def env_file(tmp_path):
    path = tmp_path / "my_env.py"
    path.write_text(ENV_FILE)
    return path


def test_an_environment_loads_from_a_file_and_from_a_module(env_file):
    cls = load_environment(f"{env_file}:Maze")
    assert cls.__name__ == "Maze" and cls().reset({"prompt": "p"}) == "p"
    assert load_environment(TOOLS_ONLY) is ToolsOnly
    # its tools from the same file: the file is one module, loaded once
    (helper,) = load_tools([f"{env_file}:helper"])
    assert helper(3) == 6 and helper.__module__ == cls.__module__


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("Maze", "is malformed: expected 'package.module:Name'"),
        ("{dir}/nope.py:Maze", "not found (relative paths are resolved from"),
        ("no_such_module_xyz:Maze", "cannot import module 'no_such_module_xyz'"),
        ("{file}:Missing", "has no attribute 'Missing'; define it there or fix the name"),
        ("{file}:maze", "names a Maze, not a class; point it at a class with reset"),
        ("{file}:NoStep", "class NoStep has no step method; an environment defines"),
    ],
)
def test_a_bad_environment_spec_names_the_spec_and_the_fix(env_file, spec, expected):
    spec = spec.format(dir=env_file.parent, file=env_file)
    with pytest.raises(ValueError) as e:
        load_environment(spec)
    assert str(e.value).startswith(f"environment spec {spec!r}")
    assert expected in str(e.value)


def test_a_file_that_fails_to_import_says_why(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import no_such_module_xyz\n")
    with pytest.raises(ValueError, match="importing .* failed: ModuleNotFoundError"):
        load_environment(f"{path}:Env")
    with pytest.raises(ValueError, match="tool spec .* names a int, not a function"):
        load_tools(["sys:maxsize"])


def test_a_step_result_and_a_four_tuple_become_the_same_checked_record():
    msgs = [{"role": "user", "content": "next", "name": "x"}]
    expected = StepResult(msgs, 1.0, True, {"k": 1})
    assert check_step_result((msgs, 1, True, {"k": 1})) == expected
    assert check_step_result(StepResult(msgs, 1.0, True, {"k": 1})) == expected
    # a string is one user message; None reward and None info are allowed
    assert check_step_result(("hi", None, False, None)) == StepResult(
        [{"role": "user", "content": "hi"}], None, False, {}
    )
    assert check_step_result(([], None, True, {})).messages == []


@pytest.mark.parametrize(
    "value, error, expected",
    [
        ("text", TypeError, "returned a str; return StepResult(messages, reward, done, info)"),
        (("m", 1.0, True, {}, {}), TypeError, "returned a 5-tuple; return StepResult"),
        ((7, 1.0, True, {}), TypeError, 'messages are a int; return a list of {"role"'),
        ((["hi"], 1.0, True, {}), TypeError, "message 0 is a str"),
        (([{"role": "user"}], 1.0, True, {}), TypeError, "message 0 has no string content"),
        (([{"role": 1, "content": None}], 1.0, True, {}), TypeError, "no string role or content"),
        (("m", "1.0", True, {}), TypeError, "reward is a str; return a float, or None"),
        (("m", True, True, {}), TypeError, "reward is a bool"),
        (("m", math.nan, True, {}), ValueError, "reward is nan; return a finite float or None"),
        (("m", math.inf, True, {}), ValueError, "reward is inf"),
        (("m", 1.0, 1, {}), TypeError, "done is a int; return True or False"),
        (("m", 1.0, True, []), TypeError, "info is a list; return a dict"),
    ],
)
def test_a_bad_step_result_names_the_environment_and_the_fix(value, error, expected):
    with pytest.raises(error) as e:
        check_step_result(value, "environment my_env.py:Maze: step")
    assert str(e.value).startswith("environment my_env.py:Maze: step")
    assert expected in str(e.value)


def test_the_first_messages_may_not_be_empty():
    with pytest.raises(ValueError, match="reset: returned no messages"):
        check_messages([], "reset", allow_empty=False)


def test_tools_only_asks_the_rows_prompt_and_ends_at_the_first_answer_without_tools():
    env = ToolsOnly()
    assert env.reset({"prompt": "2+2?", "answer": 4}) == [{"role": "user", "content": "2+2?"}]
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
    assert env.reset({"prompt": "ignored", "messages": chat}) == chat
    with pytest.raises(ValueError, match="neither 'messages' .* nor a string 'prompt'"):
        env.reset({"question": "2+2?"})
    assert env.step({"role": "assistant", "content": "4"}) == StepResult([], None, True, {})
    calling = {"role": "assistant", "content": "", "tool_calls": [{"name": "add"}]}
    assert env.step(calling).done is False
