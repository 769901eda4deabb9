"""The canonical form and prefix hashes of an agent's messages
(asyncrl/actors/agents/messages.py): what agents change on the way back (None for "",
whitespace, text parts, ``model_dump`` extras, tool-call ids and argument formatting) does
not change a hash; what changes the conversation (content, tools) does."""

from __future__ import annotations

import hashlib
import json

import pytest
from openai.types.chat import ChatCompletionMessage

from asyncrl.actors.agents.messages import (
    Refused,
    canon,
    chain,
    openai_tool_calls,
    prefix_hashes,
    read_messages,
    template_message,
    tools_key,
)
from asyncrl.actors.episodes.tool_calls import ToolCall

CALC = {
    "type": "function",
    "function": {"name": "calculate", "parameters": {"type": "object", "properties": {}}},
}


def test_none_empty_and_stripped_content_are_one_content():
    a = canon({"role": "assistant", "content": None})
    assert a == canon({"role": "assistant", "content": ""}) == canon({"role": "assistant"})
    assert canon({"role": "user", "content": " 42\n"}) == {"role": "user", "content": "42"}


def test_text_parts_are_joined_and_images_refused_naming_the_field():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert canon({"role": "user", "content": parts}) == canon({"role": "user", "content": "a\nb"})
    image = {"type": "image_url", "image_url": {"url": "data:"}}
    with pytest.raises(Refused) as e:
        read_messages({"messages": [{"role": "user", "content": ["x", image][1:]}]})
    assert e.value.param == "messages[0].content[0]"
    with pytest.raises(Refused) as e:
        read_messages({"messages": [{"role": "function", "content": "x"}]})
    assert e.value.param == "messages[0]"
    with pytest.raises(Refused):
        read_messages({"messages": []})


def test_a_returned_message_sent_back_by_model_dump_is_the_same_message():
    """The openai client's message object carries ``refusal``, ``annotations``, ``audio``,
    ``function_call`` and the call ids; the agent may send arguments back as a dict."""
    ours = {
        "role": "assistant",
        "content": None,
        "tool_calls": openai_tool_calls([ToolCall("calculate", {"expression": "1+2"})], "c_0"),
    }
    dumped = ChatCompletionMessage.model_validate(ours).model_dump()
    assert {"refusal", "annotations", "audio", "function_call"} <= set(dumped)
    assert canon(dumped) == canon(ours)
    rewritten = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "other", "function": {"name": "calculate", "arguments": {"expression": "1+2"}}}
        ],
    }
    assert canon(rewritten) == canon(ours)
    assert canon(ours)["tool_calls"] == [["calculate", {"expression": "1+2"}]]


def test_a_different_call_or_content_is_a_different_message():
    base = {"role": "assistant", "content": "x"}
    assert canon(base) != canon({"role": "assistant", "content": "y"})
    assert canon(base) != canon({"role": "user", "content": "x"})
    a = openai_tool_calls([ToolCall("calculate", {"expression": "1"})], "c")
    b = openai_tool_calls([ToolCall("calculate", {"expression": "2"})], "c")
    assert canon({"role": "assistant", "tool_calls": a}) != canon(
        {"role": "assistant", "tool_calls": b}
    )


def test_hashes_chain_over_the_canonical_json():
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    h = prefix_hashes(msgs, "[]")
    assert len(h) == 3
    assert h[0] == hashlib.sha256(b"[]").digest()
    want1 = hashlib.sha256(h[0] + json.dumps(canon(msgs[0]), sort_keys=True).encode()).digest()
    assert h[1] == want1
    assert h[2] == chain(h[1], msgs[1])
    # a prefix's hash does not depend on what follows it
    assert prefix_hashes(msgs[:1], "[]") == h[:2]


def test_the_tools_key_separates_tool_sets_and_ignores_key_order():
    reordered = {"function": CALC["function"], "type": "function"}
    assert tools_key([CALC]) == tools_key([reordered])
    assert tools_key(None) == tools_key([]) != tools_key([CALC])
    msgs = [{"role": "user", "content": "hi"}]
    assert prefix_hashes(msgs, tools_key([CALC]))[1] != prefix_hashes(msgs, tools_key([]))[1]


def test_template_messages_keep_the_text_and_give_arguments_as_objects():
    msg = {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": openai_tool_calls([ToolCall("calculate", {"expression": "1"})], "c"),
    }
    assert template_message(msg) == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "calculate", "arguments": {"expression": "1"}},
            }
        ],
    }
    tool = {"role": "tool", "content": " 1 ", "tool_call_id": "c_0"}
    assert template_message(tool) == tool
