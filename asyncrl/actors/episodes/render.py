"""A chat template as token ids, for a conversation that grows a turn at a time.

``ChatRenderer.prompt_ids`` renders an episode's first messages once. After that the
conversation is never rendered again: ``delta_ids`` gives the tokens the template adds after a
finished assistant turn for the next environment or tool messages, plus the next generation
prompt, from a fixed base conversation (the trick of SkyRL and verl)::

    base  = [user "hi", assistant STUB]                       rendered without generation prompt
    full  = base + new_messages                               rendered with the generation prompt
    delta = what ``full`` renders after STUB's content, less the end-of-turn token the model
            sampled itself (``<|im_end|>`` in ChatML; the ``"\\n"`` after it is the template's)

Only the text *after* the stub must be stable: a template that re-renders earlier assistant
turns (Qwen3 strips their ``<think>`` and writes an empty one into the last) still gives the
right delta, while a template that renders the end of a turn differently once something follows
it raises a ``ValueError`` naming the problem.

Tools: a template that renders ``tools=`` gets them; one that ignores them (SmolLM2's plain
ChatML) is noticed, and the tools are written into the system message instead, in the Hermes
format Qwen 2.5's template uses (``hermes_tools_section``); ``tools_in_template`` says which.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

Message = dict[str, Any]

_STUB = "stub_5c1e"
"""The base conversation's assistant content: letters, digits and ``_`` only (the demo
tokenizer's alphabet) and unlikely in any real message."""
_BASE: list[Message] = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": _STUB},
]


def hermes_tools_section(tools: Sequence[dict[str, Any]]) -> str:
    """The tools as Qwen 2.5's template describes them in its system message: a ``# Tools``
    section with one JSON schema a line inside ``<tools></tools>``, and the
    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` format to call them."""
    schemas = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>{schemas}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


class ChatRenderer:
    """A tokenizer's chat template (or ``chat_template``) with the episode's ``tools`` (their
    JSON schemas, ``ToolBox.schemas()``), rendering to token ids as
    ``apply_chat_template(..., tokenize=True)`` does (the text encoded without special tokens
    added). ``template_kwargs`` go to the template (e.g. Qwen3's ``enable_thinking``).

    Attributes: ``tools_in_template`` is False when the template ignores ``tools=`` and the
    renderer writes them into the system message (``tools_section(tools)`` appended to the
    first system message's content, or a system message of its own placed first); True when
    the template renders them, or there are none. ``end_of_turn`` is the special token the
    template writes right after an assistant's content (None if it writes plain text there,
    as the demo tokenizer's ``"\\n"``).
    """

    def __init__(
        self,
        tokenizer: Any,
        tools: Sequence[dict[str, Any]] = (),
        *,
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        tools_section: Callable[[Sequence[dict[str, Any]]], str] = hermes_tools_section,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = [dict(t) for t in tools]
        self.chat_template = chat_template
        self.template_kwargs = dict(template_kwargs or {})
        self.tools_section = tools_section
        if chat_template is None and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "the tokenizer has no chat template; multi-turn episodes render their "
                "conversation with one (give the model one, or pass chat_template=)"
            )
        self.tools_in_template = True
        if self.tools:
            probe = [{"role": "user", "content": "hi"}]
            self.tools_in_template = self._apply(probe, self.tools, True) != self._apply(
                probe, None, True
            )
        tail = self._after_stub(self.render_text(_BASE, False), "the base conversation")
        self._base_tail = tail
        tail_ids = self.encode(tail)
        specials = _special_ids(tokenizer)
        cut = next((i + 1 for i, t in enumerate(tail_ids) if t in specials), 0)
        self.end_of_turn: int | None = tail_ids[cut - 1] if cut else None
        self._close_ids = tail_ids[:cut]
        """What closes an assistant turn up to its end-of-turn token (``[<|im_end|>]``)."""
        self._end_ids = tail_ids
        """What the template writes after the last assistant's content (``<|im_end|>\\n``)."""
        self.delta_ids([{"role": "user", "content": "hi"}], (), closed=True)  # unstable: raises

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def render_text(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        """``messages`` as the template renders them, tools included (see the class)."""
        if self.tools_in_template:
            return self._apply(messages, self.tools or None, add_generation_prompt)
        return self._apply(self.with_tools_system(messages), None, add_generation_prompt)

    def render_ids(self, messages: Sequence[Message], add_generation_prompt: bool) -> list[int]:
        """[L] ``render_text`` as token ids: the whole conversation rendered at once."""
        return self.encode(self.render_text(messages, add_generation_prompt))

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """[P] the first messages of an episode with the generation prompt."""
        return self.render_ids(messages, True)

    def delta_ids(
        self, new_messages: Sequence[Message], after: Sequence[int], closed: bool | None = None
    ) -> list[int]:
        """The token ids the template adds after a finished assistant turn for
        ``new_messages`` (tool or user messages) and the next generation prompt.

        ``after``: the ids of the turn (or the trajectory) these messages follow. When they do
        not end with ``end_of_turn`` (the turn stopped at a stop string) the delta starts with
        the template's end-of-turn tokens; ``closed`` overrides what the ids say. Raises a
        ``ValueError`` when the template renders the end of an assistant turn differently
        once messages follow it (no delta is then stable)."""
        if closed is None:
            closed = self.closes(after)
        roles = ", ".join(str(m.get("role")) for m in new_messages) or "no"
        tail = self._after_stub(
            self.render_text([*_BASE, *new_messages], True), f"base + {roles} messages"
        )
        ids = self.encode(tail)
        if not tail.startswith(self._base_tail) or ids[: len(self._close_ids)] != self._close_ids:
            raise ValueError(
                "the chat template is not prefix-stable after an assistant turn: it ends the "
                f"turn with {self._base_tail!r} when the conversation ends there but renders "
                f"{tail[: len(self._base_tail) + 20]!r}... when {roles} messages follow, so "
                "the tokens after a sampled turn depend on what comes next; use a template "
                "that renders each assistant turn the same wherever it stands"
            )
        return ids[len(self._close_ids) :] if closed else ids

    def end_ids(self, closed: bool = True) -> list[int]:
        """What the template writes after the content of an assistant turn that ends the
        conversation (``"\\n"`` after a sampled ``<|im_end|>``); as ``delta_ids``."""
        return self._end_ids[len(self._close_ids) :] if closed else list(self._end_ids)

    def closes(self, token_ids: Sequence[int]) -> bool:
        """Whether a turn's sampled ``token_ids`` end with the template's end-of-turn token
        (always True for a template without one: nothing to add)."""
        return self.end_of_turn is None or (bool(token_ids) and token_ids[-1] == self.end_of_turn)

    def with_tools_system(self, messages: Sequence[Message]) -> list[Message]:
        """``messages`` with the tools section in the system message (see the class)."""
        out = [dict(m) for m in messages]
        if not self.tools:
            return out
        section = self.tools_section(self.tools)
        if out and out[0].get("role") == "system":
            content = out[0].get("content") or ""
            out[0]["content"] = f"{content}\n\n{section}" if content else section
        else:
            out.insert(0, {"role": "system", "content": section})
        return out

    def _apply(self, messages: Sequence[Message], tools: Any, generation: bool) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                list(messages),
                tools=tools,
                chat_template=self.chat_template,
                add_generation_prompt=generation,
                tokenize=False,
                **self.template_kwargs,
            )
        except Exception as e:  # a template may raise on any shape it dislikes (roles, order)
            roles = ", ".join(str(m.get("role")) for m in messages)
            raise ValueError(
                f"the chat template fails on a conversation of roles [{roles}]: "
                f"{type(e).__name__}: {e}"
            ) from e
        return str(text)

    @staticmethod
    def _after_stub(text: str, what: str) -> str:
        """The text after the stub assistant's content in ``text``."""
        if text.count(_STUB) != 1:
            raise ValueError(
                f"the chat template renders the assistant message {_STUB!r} of {what} "
                f"{text.count(_STUB)} times, not once; delta rendering needs each assistant "
                f"message's content rendered as it is: {text!r}"
            )
        return text[text.index(_STUB) + len(_STUB) :]


def _special_ids(tokenizer: Any) -> set[int]:
    """Ids of the tokenizer's special tokens, named or added as special (Llama 3's
    ``<|eot_id|>`` is only the latter)."""
    ids = set(getattr(tokenizer, "all_special_ids", ()))
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return ids | {i for i, tok in added.items() if getattr(tok, "special", False)}
