"""An OpenAI chat request's messages, as the agent endpoint reads them: checked, made
canonical and hashed, so that a call can be matched with the calls it continues.

``canon(msg)`` keeps what makes two messages the same turn and drops what agents change on
the way back: the role; the content as one stripped string (None and "" equal, text parts
joined); tool calls as ``[name, arguments-as-JSON-object]`` (their ids left out: agents
regenerate them); ``tool_call_id`` and ``name``. Every other key (``model_dump()``'s
``refusal``, ``annotations``, ``audio``, ``function_call``) is dropped. A match only selects
which recorded tokens to reuse, so nothing here decides a token.

``prefix_hashes(messages, key)[i]`` names the first ``i`` messages under one tool set::

    h[0]   = sha256(tools_key)
    h[i+1] = sha256(h[i] || canon_json(messages[i]))      len(h) == len(messages) + 1
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from asyncrl.actors.episodes.tool_calls import ToolCall

Message = dict[str, Any]

ROLES = ("system", "developer", "user", "assistant", "tool")
"""The roles a request may carry (``function``, the deprecated one, is refused)."""


class Refused(ValueError):
    """A request the endpoint will not serve: answered 400 naming ``param`` (the request's
    field), with ``code`` as the OpenAI error code. ``end``: the episode ends with this
    ``EPISODE_ENDS`` kind (a budget spent), or None (the episode goes on)."""

    def __init__(
        self, param: str, message: str, code: str = "invalid_request", end: str | None = None
    ) -> None:
        super().__init__(message)
        self.param, self.code, self.end = param, code, end


def content_text(content: Any, where: str) -> str:
    """A message's ``content`` as one string: None -> "", a string as is, text parts joined
    with newlines. Any other part (an image, audio) is refused naming ``where``."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise Refused(where, f"{where}: content must be a string, null or a list of parts")
    texts = []
    for k, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise Refused(f"{where}[{k}]", f"{where}[{k}]: only text parts are served, not {kind}")
        texts.append(str(part.get("text") or ""))
    return "\n".join(texts)


def _arguments(raw: Any) -> Any:
    """A tool call's arguments as a JSON value: a JSON string parsed (an invalid one kept
    as the string), an object as is."""
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except ValueError:
            return raw
    return raw if raw is not None else {}


def _calls(msg: Message) -> list[tuple[str, Any]]:
    """``(name, arguments)`` of each tool call in ``msg`` (OpenAI's ``function`` shape)."""
    out = []
    for call in msg.get("tool_calls") or []:
        fn = (call.get("function") or {}) if isinstance(call, dict) else {}
        out.append((str(fn.get("name", "")), _arguments(fn.get("arguments"))))
    return out


def canon(msg: Message) -> dict[str, Any]:
    """The canonical form of one message (see the module docstring); keys with empty values
    are left out, so an absent key and a None one are equal."""
    out: dict[str, Any] = {
        "role": msg.get("role"),
        "content": content_text(msg.get("content"), "content").strip(),
    }
    calls = _calls(msg)
    if calls:
        out["tool_calls"] = [[name, args] for name, args in calls]
    for key in ("tool_call_id", "name"):
        if msg.get(key):
            out[key] = str(msg[key])
    return out


def _canon_json(msg: Message) -> bytes:
    return json.dumps(canon(msg), sort_keys=True, ensure_ascii=False).encode()


def chain(prev: bytes, msg: Message) -> bytes:
    """The hash of a message list ending in ``msg`` whose first messages hash to ``prev``."""
    return hashlib.sha256(prev + _canon_json(msg)).digest()


def tools_key(tools: Sequence[dict[str, Any]] | None) -> str:
    """The tool set as sorted-key JSON: other tools -> another key, so no match across."""
    return json.dumps(list(tools or []), sort_keys=True, ensure_ascii=False)


def prefix_hashes(messages: Sequence[Message], key: str) -> list[bytes]:
    """[len(messages) + 1] the hash of each prefix of ``messages`` under tools ``key``."""
    out = [hashlib.sha256(key.encode()).digest()]
    for msg in messages:
        out.append(chain(out[-1], msg))
    return out


def read_messages(body: dict[str, Any]) -> list[Message]:
    """The request's ``messages``, checked: a non-empty list of objects with a known role
    and text content (``Refused`` naming the first bad field)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Refused("messages", "messages: a non-empty list of chat messages is required")
    for k, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in ROLES:
            raise Refused(f"messages[{k}]", f"messages[{k}]: role must be one of {ROLES}")
        content_text(msg.get("content"), f"messages[{k}].content")
    return messages


def template_message(msg: Message) -> Message:
    """``msg`` as chat templates take it: content one string (not stripped: the agent's text
    as sent), tool calls with their arguments as objects, ``tool_call_id`` and ``name``."""
    out: Message = {"role": msg["role"], "content": content_text(msg.get("content"), "content")}
    calls = _calls(msg)
    if calls:
        out["tool_calls"] = [
            {"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls
        ]
    for key in ("tool_call_id", "name"):
        if msg.get(key):
            out[key] = str(msg[key])
    return out


def openai_tool_calls(calls: Sequence[ToolCall], prefix: str) -> list[dict[str, Any]]:
    """Parsed calls in OpenAI's reply format, ids ``f"{prefix}_{k}"`` (k in order)."""
    return [
        {
            "id": f"{prefix}_{k}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
        }
        for k, c in enumerate(calls)
    ]
