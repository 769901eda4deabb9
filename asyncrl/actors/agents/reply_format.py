"""A recorded call's reply in the shapes OpenAI's clients read besides the plain body: the
sampled tokens' log-probs (``logprobs: true``) and the stream of ``chat.completion.chunk``
events (``stream: true``).

The endpoint samples a call whole (its tool calls are parsed from the whole text), so a stream
carries the finished reply, not tokens as they come: a client that streams works unchanged,
with the latency of a non-streaming call::

    data: {"object": "chat.completion.chunk", "choices": [{"delta": {"role": "assistant",
           "content": TEXT}, "logprobs": ..., "finish_reason": null}], ...}
    data: {... "delta": {"tool_calls": [{"index": 0, "id": ..., "type": "function",
           "function": {"name": ..., "arguments": ...}}]} ...}          (when it has calls)
    data: {... "delta": {}, "finish_reason": "stop" | "length" | "tool_calls"}
    data: {... "choices": [], "usage": {...}}              (stream_options.include_usage)
    data: [DONE]

Log-probs are those the engine reported when it sampled each token (the ones trained as the
behaviour policy's); ``top_logprobs`` is always ``[]`` (the engine samples without them, so a
request for them is refused: policy.py).
"""

from __future__ import annotations

import json
from typing import Any


def logprobs_content(tokenizer: Any, token_ids: list[int], logprobs: list[float]) -> dict:
    """OpenAI's ``choice.logprobs``: per sampled token its text (the token decoded alone, so
    a character split over tokens shows as U+FFFD), the UTF-8 bytes of that text, its
    log-prob and no alternatives."""
    content = []
    for token, logprob in zip(token_ids, logprobs, strict=True):
        text = tokenizer.decode([token])
        content.append(
            {
                "token": text,
                "logprob": logprob,
                "bytes": list(text.encode("utf-8")),
                "top_logprobs": [],
            }
        )
    return {"content": content}


def stream_chunks(completion: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` events of a ``chat.completion`` body (module docstring),
    in order; with ``include_usage`` every event carries ``usage`` (null but the last)."""
    choice = completion["choices"][0]
    message = choice["message"]
    head = {k: completion[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"

    def event(delta: dict, finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
        out = {**head, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs,
                                    "finish_reason": finish}]}  # fmt: skip
        return {**out, "usage": None} if include_usage else out

    events = [event({"role": "assistant", "content": message.get("content")}, None,
                    choice.get("logprobs"))]  # fmt: skip
    if message.get("tool_calls"):
        calls = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        events.append(event({"tool_calls": calls}))
    events.append(event({}, choice["finish_reason"]))
    if include_usage:
        events.append({**head, "choices": [], "usage": completion["usage"]})
    return events


def sse_body(events: list[dict[str, Any]]) -> bytes:
    """``events`` as server-sent events, one ``data:`` line each, then ``data: [DONE]``."""
    lines = [f"data: {json.dumps(e, ensure_ascii=False)}\n\n" for e in events]
    return "".join([*lines, "data: [DONE]\n\n"]).encode("utf-8")
