"""The environment a user writes: a class with ``reset(row)`` and ``step(message)``, loaded by
spec like ``task.reward_fn`` (``"package.module:Name"`` or ``"path/to/file.py:Name"``).

    class Environment:                       # one instance per episode, made with Name()
        def reset(self, row) -> messages     # row: the prompt's fields, "prompt" (its text),
                                             # "episode" (j of the prompt's n), "group_id"
                                             # and, for a chat prompt, "messages"
        def step(self, message) -> StepResult | (messages, reward, done, info)
        def tools(self) -> [callables]       # optional: functions or bound methods
        def close(self) -> None              # optional

``reset`` and ``step`` may be ``async def``. ``messages`` is a list of chat messages
(``{"role": ..., "content": str}``, other keys kept) or a string, meaning one user message.
``message`` is the model's turn: ``{"role": "assistant", "content": str}`` (the runner calls
``step`` for a turn without tool calls; tool calls are answered by the tools). ``reward`` None
means "no reward from this step": if no step of an episode gives one, the runner scores the
last answer with ``task.reward_fn``; else the episode's reward is the sum of its steps'.

A task that only gives tools (and a reward function) uses the built-in ``ToolsOnly``
(``TOOLS_ONLY``): its tools are the pool's ``tool_specs`` (``"module:function"``), which every
environment's episodes get besides the ones its own ``tools()`` returns.

Environments run in worker processes (``env_worker``, driven by ``env_pool.EnvPool``); the
checks here run there, and name the environment and the fix when a return value is wrong.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from asyncrl.core.runtime.specs import check_constructor
from asyncrl.core.runtime.specs import load_object as _load

Messages = list[dict[str, Any]]


class Environment(Protocol):
    """What ``load_environment`` loads (see the module docstring). ``tools()`` and ``close()``
    are optional, so they are not part of the protocol's type."""

    def reset(self, row: dict) -> Messages | str | Awaitable[Messages | str]: ...

    def step(self, message: dict) -> StepResult | tuple | Awaitable[StepResult | tuple]: ...


@dataclass
class StepResult:
    """What a step answers: the messages the model reads next (possibly none), this step's
    reward (None: none), whether the episode is over, and anything to log (JSON values)."""

    messages: Messages
    reward: float | None = None
    done: bool = False
    info: dict = field(default_factory=dict)


def load_object(spec: str, what: str) -> Any:
    """The object named by ``spec`` (``"module:attr"`` or ``"file.py:attr"``); ``what`` names it
    in errors (``"environment"``, ``"tool"``). ``asyncrl.core.runtime.specs.load_object``, with
    a file shared by every spec that names it (an environment and its tools in one file are
    one module)."""
    return _load(spec, what, share=True)


def load_environment(spec: str, kwargs: dict | None = None) -> type:
    """The environment class named by ``spec``; a ``ValueError`` naming the spec and the fix
    when it cannot be loaded, is not a class, lacks ``reset`` or ``step``, or its constructor
    does not take ``kwargs`` (``episode.env_kwargs``: each episode is ``cls(**kwargs)``)."""
    cls = load_object(spec, "environment")
    if not isinstance(cls, type):
        raise ValueError(
            f"environment spec {spec!r} names a {type(cls).__name__}, not a class; point it at "
            "a class with reset(row) and step(message) (one instance per episode)"
        )
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if missing:
        raise ValueError(
            f"environment spec {spec!r}: class {cls.__qualname__} has no {' or '.join(missing)} "
            "method; an environment defines reset(self, row) -> messages and step(self, "
            "message) -> StepResult or (messages, reward, done, info)"
        )
    check_constructor(cls, kwargs or {}, f"environment spec {spec!r}", "episode.env_kwargs",
                      "give the keyword arguments its __init__ takes")  # fmt: skip
    return cls


def load_tools(specs: Sequence[str]) -> list[Callable[..., Any]]:
    """The functions named by ``specs`` (``"module:function"`` or ``"file.py:function"``)."""
    tools = []
    for spec in specs:
        fn = load_object(spec, "tool")
        if not callable(fn):
            raise ValueError(f"tool spec {spec!r} names a {type(fn).__name__}, not a function")
        tools.append(fn)
    return tools


def check_messages(x: Any, where: str, allow_empty: bool = True) -> Messages:
    """``x`` as a list of chat messages: a string is one user message; otherwise each item must
    be a dict with a string ``role`` and a string ``content`` (other keys are kept)."""
    if isinstance(x, str):
        return [{"role": "user", "content": x}]
    fix = 'return a list of {"role": str, "content": str} dicts, or a str (one user message)'
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"{where}: messages are a {type(x).__name__}; {fix}")
    if not x and not allow_empty:
        raise ValueError(f"{where}: returned no messages; the first prompt needs one at least")
    for i, m in enumerate(x):
        if not isinstance(m, dict):
            raise TypeError(f"{where}: message {i} is a {type(m).__name__}; {fix}")
        bad = [k for k in ("role", "content") if not isinstance(m.get(k), str)]
        if bad:
            got = {k: type(m.get(k)).__name__ for k in bad}
            raise TypeError(f"{where}: message {i} has no string {' or '.join(bad)} ({got}); {fix}")
    return [dict(m) for m in x]


def check_step_result(x: Any, where: str = "the environment's step") -> StepResult:
    """``x`` (a ``StepResult`` or a 4-tuple ``(messages, reward, done, info)``) as a checked
    ``StepResult``: messages as ``check_messages``; ``reward`` a finite number or None;
    ``done`` a bool; ``info`` a dict (None: ``{}``). ``where`` names the environment in the
    ``TypeError`` / ``ValueError`` raised otherwise, which says the fix."""
    if isinstance(x, StepResult):
        messages, reward, done, info = x.messages, x.reward, x.done, x.info
    elif isinstance(x, tuple) and len(x) == 4:
        messages, reward, done, info = x
    else:
        got = f"a {len(x)}-tuple" if isinstance(x, tuple) else f"a {type(x).__name__}"
        raise TypeError(
            f"{where} returned {got}; return StepResult(messages, reward, done, info) or the "
            "4-tuple (messages, reward, done, info) (not gymnasium's 5-tuple)"
        )
    messages = check_messages(messages, where)
    if reward is not None:
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            raise TypeError(
                f"{where}: reward is a {type(reward).__name__}; return a float, or None for "
                "no reward from this step"
            )
        if not math.isfinite(reward):
            raise ValueError(f"{where}: reward is {reward}; return a finite float or None")
        reward = float(reward)
    if type(done).__name__ not in ("bool", "bool_"):  # numpy's bool too
        raise TypeError(f"{where}: done is a {type(done).__name__}; return True or False")
    if info is None:
        info = {}
    if not isinstance(info, dict):
        raise TypeError(f"{where}: info is a {type(info).__name__}; return a dict (or {{}})")
    return StepResult(messages, reward, bool(done), info)


TOOLS_ONLY = "asyncrl.actors.episodes.env:ToolsOnly"
"""The spec of ``ToolsOnly``, the environment of a task with tools and no environment."""


class ToolsOnly:
    """A task's prompt, answered by its tools until the model answers without calling one.

    ``reset`` returns ``row["messages"]`` if the row has them, else ``row["prompt"]`` as one
    user message. ``step`` (the runner calls it for a turn without tool calls) ends the
    episode with no reward, so the runner scores the answer with ``task.reward_fn``; a
    message that still carries ``tool_calls`` does not end it. The tools are the pool's
    ``tool_specs``."""

    def reset(self, row: dict) -> Messages:
        if "messages" in row:
            return check_messages(row["messages"], "ToolsOnly: row['messages']", False)
        if not isinstance(row.get("prompt"), str):
            raise ValueError(
                "ToolsOnly: the row has neither 'messages' (a chat) nor a string 'prompt'; "
                f"its keys: {sorted(row)}"
            )
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, message: dict) -> StepResult:
        return StepResult([], None, done=not message.get("tool_calls"))
