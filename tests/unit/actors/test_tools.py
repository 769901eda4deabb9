"""Plain functions as tools (asyncrl/actors/episodes/tools.py): the schema from signature and
docstring, and a call that always answers the model: the result, or the error as text,
counted by kind."""

import asyncio
import time

import pytest

from asyncrl.actors.episodes.tool_calls import ToolCall
from asyncrl.actors.episodes.tools import ToolBox, tool_from_function


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: The dividend.
        b: The divisor.
    """
    return a / b


async def lookup(key: str) -> dict:
    """Look a key up.

    Args:
        key: What to look up.
    """
    return {"key": key, "found": True}


def slow(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return "done"


def undocumented(a: int) -> int:
    return a


def run(box: ToolBox, name: str, **arguments):
    return asyncio.run(box.call(ToolCall(name, arguments)))


def test_the_schema_comes_from_the_signature_and_the_docstring():
    tool = tool_from_function(add)
    assert tool.name == "add" and tool.fn is add
    assert tool.schema["type"] == "function"
    fn = tool.schema["function"]
    assert fn["description"] == "Add two integers."
    assert fn["parameters"]["required"] == ["a", "b"]
    assert fn["parameters"]["properties"]["a"] == {
        "type": "integer",
        "description": "The first number.",
    }
    assert ToolBox([add, lookup]).schemas() == [tool.schema, tool_from_function(lookup).schema]


def test_a_function_that_cannot_be_a_tool_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="tool 'undocumented': .*no docstring.*'Args:' line"):
        tool_from_function(undocumented)
    with pytest.raises(ValueError, match="two tools are named 'add'; rename one"):
        ToolBox([add, add])
    with pytest.raises(ValueError, match="timeout_s must be > 0, got 0"):
        ToolBox([add], timeout_s=0)


def test_results_are_text_for_the_model():
    box = ToolBox([add, lookup])
    assert run(box, "add", a=17, b=25).content == "42"
    result = run(box, "lookup", key="x")
    assert (result.content, result.error) == ('{"key": "x", "found": true}', None)
    assert box.calls == 2 and sum(box.errors.values()) == 0


def test_every_error_answers_the_model_and_is_counted_by_kind():
    box = ToolBox([add, divide, slow], timeout_s=0.2)
    unknown = run(box, "mul", a=1, b=2)
    assert unknown.error == "unknown_tool"
    assert unknown.content == "Error: no tool named 'mul'; tools: add, divide, slow"
    bad = run(box, "add", a=1)
    assert bad.error == "bad_arguments" and bad.content.startswith("Error: bad arguments for add:")
    raised = run(box, "divide", a=1, b=0)
    assert raised.error == "raised"
    assert raised.content == "Error: divide raised ZeroDivisionError: division by zero"

    async def timed():
        t0 = time.monotonic()
        result = await box.call(ToolCall("slow", {"seconds": 2.0}))
        return result, time.monotonic() - t0  # the thread finishes later, unwaited

    late, waited = asyncio.run(timed())
    assert waited < 1.5, f"the deadline did not hold: {waited:.2f}s"
    assert (late.error, late.content) == ("timeout", "Error: slow did not answer within 0.2s")
    assert dict(box.errors) == {"unknown_tool": 1, "bad_arguments": 1, "raised": 1, "timeout": 1}
    assert box.calls == 4


def test_a_slow_tool_does_not_block_other_calls():
    """Sync tools run in worker threads: two 0.6 s calls overlap instead of queueing."""
    box = ToolBox([slow])

    async def both():
        return await asyncio.gather(
            box.call(ToolCall("slow", {"seconds": 0.6})),
            box.call(ToolCall("slow", {"seconds": 0.6})),
        )

    t0 = time.monotonic()
    results = asyncio.run(both())
    assert [r.content for r in results] == ["done", "done"]
    assert time.monotonic() - t0 < 1.1  # one after the other: 1.2 s or more
