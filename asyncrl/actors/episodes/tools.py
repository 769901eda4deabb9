"""Plain Python functions as a model's tools.

A tool is a function with type hints and a Google-style docstring (``Args:``): its schema
(the OpenAI function format that ``apply_chat_template(tools=...)`` takes) comes from
transformers' ``get_json_schema``. ``ToolBox.call`` runs one ``ToolCall`` and always returns
an answer for the model: the tool's result as text, or, when the tool is unknown, the
arguments do not fit, the tool raises or it overruns its deadline, the error as text. Every
error is counted by kind in ``ToolBox.errors``; nothing is dropped.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from asyncrl.actors.episodes.tool_calls import ToolCall

ERROR_KINDS = ("unknown_tool", "bad_arguments", "raised", "timeout")
"""The kinds of ``ToolBox.errors``, the counts a run reports."""


@dataclass(frozen=True)
class Tool:
    """One tool: its name (the function's), the function and its JSON schema."""

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]


@dataclass(frozen=True)
class ToolResult:
    """What a call answers: ``content`` is the text the model reads as the tool's message;
    ``error`` is the error's kind (one of ``ERROR_KINDS``), None when the tool answered."""

    name: str
    content: str
    error: str | None = None


def tool_from_function(fn: Callable[..., Any]) -> Tool:
    """``fn`` as a tool; a ``ValueError`` naming the fix when its schema cannot be built
    (no docstring, an argument without a type hint or a line under ``Args:``)."""
    from transformers.utils import get_json_schema

    try:
        schema = get_json_schema(fn)
    except Exception as e:  # transformers raises its own exception types here
        raise ValueError(
            f"tool {getattr(fn, '__name__', fn)!r}: {e} (a tool needs type hints on every "
            "argument and a Google-style docstring with an 'Args:' line for each)"
        ) from e
    return Tool(schema["function"]["name"], fn, schema)


class ToolBox:
    """The tools of one episode, by name. ``timeout_s`` bounds each call (a synchronous tool
    runs in a worker thread, so the event loop keeps serving other episodes meanwhile; a
    thread past its deadline is left to finish, its answer discarded)."""

    def __init__(self, tools: Iterable[Callable[..., Any]], timeout_s: float = 30.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.tools: dict[str, Tool] = {}
        for fn in tools:
            tool = tool_from_function(fn)
            if tool.name in self.tools:
                raise ValueError(f"two tools are named {tool.name!r}; rename one")
            self.tools[tool.name] = tool
        self.timeout_s = timeout_s
        self.errors: Counter[str] = Counter()
        self.calls = 0

    def schemas(self) -> list[dict[str, Any]]:
        """Every tool's schema, for ``apply_chat_template(tools=...)``."""
        return [t.schema for t in self.tools.values()]

    async def call(self, call: ToolCall) -> ToolResult:
        """Run ``call``; never raises for the tool's sake (see the module docstring)."""
        self.calls += 1
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return self._error(
                call.name, "unknown_tool", f"no tool named {call.name!r}; tools: {known}"
            )
        try:
            inspect.signature(tool.fn).bind(**call.arguments)
        except TypeError as e:
            return self._error(call.name, "bad_arguments", f"bad arguments for {call.name}: {e}")
        try:
            value = await asyncio.wait_for(self._run(tool, call.arguments), self.timeout_s)
        except asyncio.TimeoutError:
            return self._error(
                call.name, "timeout", f"{call.name} did not answer within {self.timeout_s:g}s"
            )
        except Exception as e:  # the tool's own error is the model's to read
            return self._error(call.name, "raised", f"{call.name} raised {type(e).__name__}: {e}")
        return ToolResult(call.name, _as_text(value))

    async def _run(self, tool: Tool, arguments: dict[str, Any]) -> Any:
        if inspect.iscoroutinefunction(tool.fn):
            return await tool.fn(**arguments)
        return await asyncio.to_thread(tool.fn, **arguments)

    def _error(self, name: str, kind: str, text: str) -> ToolResult:
        self.errors[kind] += 1
        return ToolResult(name, f"Error: {text}", kind)


def _as_text(value: Any) -> str:
    """A tool's return value as the text of its message: strings as they are, anything else
    as JSON (``str`` where JSON cannot say it)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
