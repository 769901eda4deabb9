"""``episode``: multi-turn episodes, an environment and tools (docs/environments.md).

With neither ``env`` nor ``tools`` set (the default) a sample is one completion of its prompt,
as before; with either, it is an episode of up to ``max_turns`` model turns that the actor runs
against the environment and the tools (asyncrl/actors/episodes/).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from asyncrl.core.config.checks import bound as _bound
from asyncrl.core.config.checks import require as _require
from asyncrl.core.config.checks import require_finite as _require_finite

TOOL_PARSERS = ("hermes",)
"""The names ``episode.tool_parser`` takes, repeated from asyncrl/actors/episodes/tool_calls.py
``PARSERS`` so the CLI validates a config without importing actor code (a test checks they
match)."""


@dataclass
class EpisodeConfig:
    """What a multi-turn episode may do, and where it stops."""

    env: str = ""
    """The environment class, ``module:Name`` or ``path/to/file.py:Name``
    (asyncrl/actors/episodes/env.py ``Environment``: ``reset(row)``, ``step(message)``,
    optional ``tools()``); '' = none: with ``tools`` set, the built-in ``ToolsOnly`` (the
    prompt, the tools, and ``task.reward_fn`` scoring the last answer)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the environment's constructor: each episode is
    ``Env(**env_kwargs)`` (JSON values: a sandbox's address, a difficulty, a time limit), so
    one class serves several runs; checked against its ``__init__`` before any process starts.
    Needs ``env``."""
    tools: list[str] = field(default_factory=list)
    """Tool functions, each ``module:function`` or ``path/to/file.py:function``: their type
    hints and docstring become the schema the chat template shows the model."""
    max_turns: int = 4
    """Most model turns in one episode (>= 1); an episode still going then ends as
    ``max_turns`` (a truncated end: ``algorithm.truncated`` says how it trains)."""
    max_tokens: int = 0
    """Most response tokens of one episode, the model's and the template's for tool and
    environment messages together (what follows the first prompt); 0 = ``max_turns x
    sampling.max_tokens``. A turn is given at most what is left; an episode whose next
    messages would not fit ends as ``max_tokens``."""
    env_timeout_s: float = 30.0
    """Longest one environment call (``reset``, ``step``) or tool call may run (> 0 s); past
    it the episode ends as ``env_timeout``, counted."""
    env_workers: int = 2
    """Environment processes per actor, 1..64; each hosts many episodes at once (an async
    ``step`` overlaps the others, a synchronous one runs in a thread)."""
    max_env_failure_frac: float = 0.5
    """Fail the run (the actor exits non-zero, naming the environment and its first failure)
    once more than this fraction of the actor's last ``env_failure_window`` episodes ended as
    ``env_timeout`` or ``env_error``; 0..1, 1.0 = never fail on environment failures."""
    env_failure_window: int = 256
    """How many of an actor's most recent episodes ``max_env_failure_frac`` looks at (>= 1);
    before that many ended the missing ones count as successes."""
    tool_parser: str = "hermes"
    """How tool calls are read from a model's turn, one of ``TOOL_PARSERS``: ``hermes`` =
    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen2.5/3, Hermes)."""

    @property
    def enabled(self) -> bool:
        """Whether samples are multi-turn episodes (an environment or tools are set)."""
        return bool(self.env or self.tools)

    def __post_init__(self) -> None:
        _require_finite(self, "episode")
        for key, spec in [("episode.env", self.env)] * bool(self.env) + [
            ("episode.tools", t) for t in self.tools
        ]:
            target, sep, name = str(spec).rpartition(":")
            _require(
                bool(sep and target and name.isidentifier()),
                f"{key}={spec!r} must be 'module:Name' or 'path/to/file.py:Name'",
            )
        _require(
            bool(self.env) or not self.env_kwargs,
            f"episode.env_kwargs={self.env_kwargs} is set but episode.env is not: they are "
            "the keyword arguments of the environment class episode.env names",
        )
        try:
            json.dumps(self.env_kwargs)
        except (TypeError, ValueError) as e:
            raise ValueError(f"episode.env_kwargs must hold JSON values ({e})") from e
        _bound(self, "episode.max_turns", ge=1)
        _bound(self, "episode.max_tokens", ge=0, hint=" (0 = max_turns x sampling.max_tokens)")
        _bound(self, "episode.env_timeout_s", gt=0)
        _bound(self, "episode.env_workers", ge=1, le=64)
        _bound(self, "episode.max_env_failure_frac", ge=0, le=1, hint=" (1.0 = never fail)")
        _bound(self, "episode.env_failure_window", ge=1)
        _require(
            self.tool_parser in TOOL_PARSERS,
            f"episode.tool_parser={self.tool_parser!r}: give one of {', '.join(TOOL_PARSERS)}",
        )

    def token_budget(self, turn_tokens: int) -> int:
        """Response tokens one episode may hold: ``max_tokens``, or for 0 ``max_turns x
        turn_tokens`` (``sampling.max_tokens``)."""
        return self.max_tokens or self.max_turns * turn_tokens
