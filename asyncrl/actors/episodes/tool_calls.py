"""The tool calls in one model turn, by format (``PARSERS``; ``hermes`` for Qwen 2.5/3,
Hermes and the models trained on their template).

A turn's text splits into its ``content`` (everything outside the calls, stripped) and its
``calls`` in order. A block that is not a well-formed call (bad JSON, no ``name``, arguments
that are not an object, a ``<tool_call>`` never closed) is not dropped: it is kept in
``malformed`` with the reason, so the episode can answer it and the run can count it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """One call a model asked for: the tool's name and its keyword arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ParsedTurn:
    """One model turn: its text outside the calls, the well-formed calls in order, and one
    reason per malformed block (in order)."""

    content: str
    calls: list[ToolCall]
    malformed: list[str]


Parser = Callable[[str], ParsedTurn]

_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_HERMES_OPEN = "<tool_call>"


def parse_hermes(text: str) -> ParsedTurn:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (vLLM's and
    transformers' ``hermes`` format). ``arguments`` may also be a JSON string of an object
    (some models write it so); a missing ``arguments`` is ``{}``."""
    calls: list[ToolCall] = []
    malformed: list[str] = []
    for block in _HERMES_BLOCK.findall(text):
        call, why = _hermes_call(block.strip())
        if call is not None:
            calls.append(call)
        else:
            malformed.append(why)
    rest = _HERMES_BLOCK.sub("", text)
    if _HERMES_OPEN in rest:  # cut by the token limit, or never closed
        head, _, tail = rest.partition(_HERMES_OPEN)
        malformed.append(f"a <tool_call> that is never closed: {_short(tail.strip())}")
        rest = head
    return ParsedTurn(content=rest.strip(), calls=calls, malformed=malformed)


def _hermes_call(block: str) -> tuple[ToolCall | None, str]:
    """The call in one block's text, or None and why it is not one."""
    try:
        obj = json.loads(block)
    except json.JSONDecodeError as e:
        return None, f"not JSON ({e.msg}): {_short(block)}"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None, f'no "name" string: {_short(block)}'
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return None, f'"arguments" is a string that is not JSON: {_short(block)}'
    if not isinstance(args, dict):
        return None, f'"arguments" is not an object: {_short(block)}'
    return ToolCall(obj["name"], args), ""


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


PARSERS: dict[str, Parser] = {"hermes": parse_hermes}
"""Tool-call formats by name. A new format is a function ``text -> ParsedTurn`` and a line
here."""


def get_parser(name: str) -> Parser:
    """The parser of format ``name``; a ``ValueError`` naming the known ones otherwise."""
    if name not in PARSERS:
        raise ValueError(f"unknown tool-call format {name!r}; known: {', '.join(sorted(PARSERS))}")
    return PARSERS[name]
