"""The agent a user writes, loaded by spec (``episode.agent``) like ``task.reward_fn`` and
``episode.env`` (``"package.module:name"`` or ``"path/to/file.py:name"``); it imports nothing
of asyncrl:

    async def agent(row, *, base_url, api_key, model): ...   # or def: run in a thread
        -> float | {"score": x, other numbers} | None        # None: task.reward_fn scores

    class Agent:                                 # one instance per episode: Agent(**kwargs)
        async def run(self, row, *, base_url, api_key, model): ...   # or def
        def close(self): ...                     # optional, sync or async

A function or ``run`` gets the keywords it names among ``base_url`` and ``api_key`` (both
required, or ``**kw``) and ``model`` (optional); a function also gets ``kwargs``
(``episode.agent_kwargs``) as extra keywords, a class takes them in its constructor.
``load_agent`` checks all this at load (the launcher, the worker), ``call_agent`` makes the
call, ``check_result`` checks what came back (the rule of ``rewards.calls.check_score``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asyncrl.actors.episodes.worker_loop import call_user
from asyncrl.actors.rewards.calls import ScoreError, check_score, short_repr
from asyncrl.actors.rewards.loading import fn_name
from asyncrl.core.runtime.specs import check_constructor, load_object

KEYWORDS = ("base_url", "api_key", "model")
"""What an agent is called with besides the row; the first two are required."""
_REQUIRED = KEYWORDS[:2]
_FN = "'async def {name}(row, *, base_url, api_key, model)'"
_RUN = "'async def run(self, row, *, base_url, api_key, model)'"
_NOTE = " (or 'def': it runs in a thread; 'model' may be left out)"


class AgentReturnError(ValueError):
    """An agent returned what cannot be a reward; ``kind`` as ``rewards.calls.ScoreError``'s
    (the message starts with it)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


@dataclass(frozen=True)
class AgentResult:
    """An agent's checked return: ``score`` None means the task's ``reward_fn`` scores the
    last answer; ``extras`` are a dict's other finite numbers (``reward/<key>``)."""

    score: float | None
    extras: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Agent:
    """A loaded, checked agent spec. ``target`` is the function or the class; ``kwargs``
    the class's constructor keywords, or a function's extra keywords (JSON values)."""

    spec: str
    target: Any
    kwargs: dict

    @property
    def is_class(self) -> bool:
        return isinstance(self.target, type)

    def make(self) -> Any:
        """One episode's agent: ``Name(**kwargs)``, or the function itself (to be run by
        ``worker_loop.call_user``: a sync constructor in a thread)."""
        return self.target(**self.kwargs) if self.is_class else self.target

    def runner(self, obj: Any) -> Callable[..., Any]:
        """What to call for ``obj`` (from ``make``): its ``run``, or the function with the
        extra keywords bound."""
        if self.is_class:
            return obj.run
        return functools.partial(obj, **self.kwargs) if self.kwargs else obj

    def closer(self, obj: Any) -> Callable[[], Any] | None:
        """``obj.close`` of a class's instance, if it has one (sync or async)."""
        return getattr(obj, "close", None) if self.is_class else None


def load_agent(spec: str, kwargs: dict | None = None) -> Agent:
    """The agent named by ``spec``, checked: a ``ValueError`` naming the spec, the signature
    found and the fix when it cannot be loaded, is neither a class nor callable, a class has
    no ``run``, its constructor cannot take ``kwargs``, or the function (``run``) cannot be
    called as ``fn(row, base_url=..., api_key=..., [model=...], **function kwargs)``."""
    kwargs = dict(kwargs or {})
    name = (spec or "").rpartition(":")[2]
    either = f"{_FN.format(name=name)} or a class {name} with {_RUN}"
    obj = load_object(spec, "agent", define=either)
    if isinstance(obj, type):
        fix = f"give it {_RUN}{_NOTE}"
        run = getattr(obj, "run", None)
        if not callable(run):
            raise ValueError(f"agent spec {spec!r}: class {name} has no run method; {fix}")
        _check_class(obj, spec, kwargs)
        _check_call(_unbound_run(obj, run), fn_name(run), spec, {}, fix)
    elif callable(obj):
        fix = f"define it as {_FN.format(name=name)}{_NOTE}"
        clash = sorted(set(kwargs) & set(KEYWORDS))
        if clash:
            raise ValueError(
                f"agent spec {spec!r}: episode.agent_kwargs names {clash}, which the endpoint "
                "gives; leave them out of agent_kwargs"
            )
        _check_call(obj, fn_name(obj), spec, kwargs, fix)
    else:
        raise ValueError(
            f"agent spec {spec!r} names a {type(obj).__name__}, not a function or a class; "
            f"define {either}"
        )
    return Agent(spec, obj, kwargs)


def accepted(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The ``KEYWORDS`` that ``fn`` takes by keyword (all with ``**kw``, or when Python
    cannot read its signature)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return KEYWORDS
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return KEYWORDS
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = {p.name for p in params if p.kind in named}
    return tuple(k for k in KEYWORDS if k in names)


async def call_agent(
    fn: Callable[..., Any], row: dict, base_url: str, api_key: str, model: str
) -> Any:
    """``fn(row, base_url=..., api_key=..., model=...)`` with only the keywords ``fn`` takes
    (``accepted``); ``fn`` is ``Agent.runner(obj)``. Awaited if async, else in a thread."""
    given = {"base_url": base_url, "api_key": api_key, "model": model}
    keywords = {k: given[k] for k in accepted(fn)}
    return await call_user(functools.partial(fn, row, **keywords))


def check_result(value: Any, where: str = "the agent") -> AgentResult:
    """What an agent returned, as an ``AgentResult``: None (``reward_fn`` scores), a number
    (not a bool) or a dict with a number under ``"score"``, finite and within
    ``MAX_ABS_REWARD``. ``AgentReturnError`` (its ``kind``: ``missing_score``,
    ``wrong_type``, ``non_finite``, ``out_of_range``) naming ``where`` and the fix otherwise."""
    if value is None:
        return AgentResult(None)
    try:
        score, extras = check_score(value)
    except ScoreError as e:
        raise AgentReturnError(
            e.kind,
            f"{where} returned {short_repr(value)}: {e}; return a float, a dict with a finite "
            "'score' (its other numbers are logged as reward/<key>), or None to have the "
            "task's reward_fn score the last answer",
        ) from None
    return AgentResult(score, extras)


def _check_class(cls: type, spec: str, kwargs: dict) -> None:
    """``cls(**kwargs)`` binds (not called: making an agent may start things); ``close``, if
    there, is callable."""
    close = getattr(cls, "close", None)
    if close is not None and not callable(close):
        raise ValueError(f"agent spec {spec!r}: {cls.__qualname__}.close is not a method")
    check_constructor(cls, kwargs, f"agent spec {spec!r}", "episode.agent_kwargs",
                      "give the keyword arguments its __init__ takes (each episode's agent "
                      "is Name(**agent_kwargs))")  # fmt: skip


def _unbound_run(cls: type, run: Callable[..., Any]) -> Callable[..., Any]:
    """``run`` (``cls.run``) as an instance's bound ``run`` is seen (``self`` left out)."""
    if isinstance(inspect.getattr_static(cls, "run", None), (staticmethod, classmethod)):
        return run
    return functools.partial(run, None)


def _check_call(fn: Callable[..., Any], name: str, spec: str, extra: dict, fix: str) -> None:
    """``fn(row, **accepted keywords, **extra)`` binds, and it takes ``base_url`` and
    ``api_key``."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    takes = accepted(fn)
    missing = [k for k in _REQUIRED if k not in takes]
    problem = f"it does not take {' and '.join(missing)} by keyword" if missing else ""
    if not problem:
        try:
            sig.bind({}, **dict.fromkeys(takes, ""), **extra)
        except TypeError as e:
            problem = f"the call fails ({e})"
    if problem:
        extras = f" plus episode.agent_kwargs {sorted(extra)}" if extra else ""
        raise ValueError(
            f"agent spec {spec!r}: {name} has the signature {sig}, but an agent is called as "
            f"fn(row, base_url=..., api_key=..., model=...){extras} ('model' only if named), "
            f"and {problem}; {fix}"
        )
