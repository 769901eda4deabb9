"""Tool calls in a model's turn (asyncrl/actors/episodes/tool_calls.py): well-formed ones in
order, every malformed block named with its reason, the text outside them kept."""

import pytest

from asyncrl.actors.episodes.tool_calls import PARSERS, ToolCall, get_parser, parse_hermes


def test_calls_in_order_and_the_text_around_them():
    text = (
        "Let me add.\n<tool_call>\n"
        '{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'
        ' then <tool_call>{"name": "now"}</tool_call>'
    )
    turn = parse_hermes(text)
    assert turn.calls == [ToolCall("add", {"a": 17, "b": 25}), ToolCall("now", {})]
    assert turn.content == "Let me add.\n then"
    assert turn.malformed == []


def test_arguments_written_as_a_json_string_are_read():
    turn = parse_hermes('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert turn.calls == [ToolCall("add", {"a": 1})] and turn.malformed == []


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        ("{name: add}", "not JSON (Expecting property name enclosed in double quotes)"),
        ('{"arguments": {}}', 'no "name" string'),
        ('{"name": ""}', 'no "name" string'),
        ('["add"]', 'no "name" string'),
        ('{"name": "add", "arguments": [1, 2]}', '"arguments" is not an object'),
        ('{"name": "add", "arguments": "a=1"}', '"arguments" is a string that is not JSON'),
    ],
)
def test_a_malformed_block_is_named_not_dropped(block, reason):
    turn = parse_hermes(f"x <tool_call>{block}</tool_call> y")
    assert turn.calls == [] and turn.content == "x  y"
    (why,) = turn.malformed
    assert why.startswith(reason), why


def test_an_unclosed_call_is_malformed_and_its_text_is_not_content():
    turn = parse_hermes('Sure. <tool_call>{"name": "add", "argu')
    assert turn.calls == [] and turn.content == "Sure."
    assert turn.malformed == ['a <tool_call> that is never closed: {"name": "add", "argu']


def test_a_turn_without_calls_is_all_content():
    turn = parse_hermes("  The answer is 42.  ")
    assert (turn.content, turn.calls, turn.malformed) == ("The answer is 42.", [], [])


def test_formats_by_name():
    assert get_parser("hermes") is parse_hermes and set(PARSERS) == {"hermes"}
    with pytest.raises(ValueError, match="unknown tool-call format 'json'; known: hermes"):
        get_parser("json")
