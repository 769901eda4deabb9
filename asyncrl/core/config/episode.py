"""``episode``: multi-turn episodes, an environment and tools (docs/environments.md).

With neither ``env`` nor ``tools`` nor ``agent`` set (the default) a sample is one completion
of its prompt, as before; with ``env`` or ``tools``, it is an episode of up to ``max_turns``
model turns that the actor runs against the environment and the tools
(asyncrl/actors/episodes/); with ``agent``, the user's agent runs the episode, calling the
policy through an OpenAI-compatible endpoint on the actor (asyncrl/actors/agents/).
"""

from __future__ import annotations

import ipaddress
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
AGENT_EXPORTS = ("last", "longest", "first", "all")
"""The names ``episode.agent_export`` takes, repeated from asyncrl/actors/agents/record.py
``EXPORT_MODES`` (a test checks they match)."""


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
    """Environment (or agent) processes per actor, 1..64; each hosts many episodes at once (an async
    ``step`` overlaps the others, a synchronous one runs in a thread)."""
    max_env_failure_frac: float = 0.5
    """Fail the run (the actor exits non-zero, naming the environment and its first failure)
    once more than this fraction of the actor's last ``env_failure_window`` episodes ended as
    ``env_timeout`` or ``env_error`` (an agent's: ``agent_error``, ``agent_timeout``,
    ``no_call``); 0..1, 1.0 = never fail on environment failures."""
    env_failure_window: int = 256
    """How many of an actor's most recent episodes ``max_env_failure_frac`` looks at (>= 1);
    before that many ended the missing ones count as successes."""
    tool_parser: str = "hermes"
    """How tool calls are read from a model's turn, one of ``TOOL_PARSERS``: ``hermes`` =
    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen2.5/3, Hermes)."""
    agent: str = ""
    """An agent that owns its loop, ``module:name`` or ``path/to/file.py:name``: ``async def
    agent(row, *, base_url, api_key, model)`` (or a class with that ``run``) calling the
    policy with any OpenAI client; its calls are recorded token for token as the episode
    (asyncrl/actors/agents/). It runs in ``env_workers`` processes per actor; ``max_turns``
    bounds its calls and ``max_tokens`` its tokens. '' = none; not with ``env`` or ``tools``
    (an agent runs its own)."""
    agent_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the agent (JSON values): a class's constructor (each episode is
    ``Agent(**agent_kwargs)``), or a function's extra keywords; checked before any process
    starts. Needs ``agent``."""
    agent_timeout_s: float = 300.0
    """Longest one agent episode may run (> 0 s), its calls to the model included; past it
    the episode ends as ``agent_timeout``, counted."""
    agent_export: str = "last"
    """Which of an episode's call chains is trained: ``last`` (holding its last call),
    ``longest`` (most model tokens) or ``first``, one per episode; ``all``: every one, each a
    sample of its own sharing the episode's reward (``Sample.part``), the last one first."""
    agent_bind: str = "127.0.0.1"
    """The address the agent endpoint listens on: a loopback address only (its per-episode
    keys travel in clear, and the agents run beside the actor)."""
    agent_port: int = 0
    """The agent endpoint's port, 0..65535; 0 = a free one per actor (several actors on one
    host need 0)."""
    agent_model: str = "policy"
    """The model id the endpoint lists (``/v1/models``) and its replies carry; a call naming
    another is served all the same (and counted)."""

    @property
    def enabled(self) -> bool:
        """Whether samples are multi-turn episodes (an environment, tools or an agent)."""
        return bool(self.env or self.tools or self.agent)

    def __post_init__(self) -> None:
        _require_finite(self, "episode")
        named = [("episode.env", self.env), ("episode.agent", self.agent)]
        for key, spec in [(k, v) for k, v in named if v] + [
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
        for key in ("env_kwargs", "agent_kwargs"):
            try:
                json.dumps(getattr(self, key))
            except (TypeError, ValueError) as e:
                raise ValueError(f"episode.{key} must hold JSON values ({e})") from e
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
        self._check_agent()

    def _check_agent(self) -> None:
        """``agent`` alone (no ``env``, no ``tools``), ``agent_kwargs`` only with it, and the
        endpoint's settings."""
        _require(
            not (self.agent and (self.env or self.tools)),
            f"episode.agent={self.agent!r} with episode.env / episode.tools set: an agent runs "
            "its own loop and tools; give either an agent or an environment and tools",
        )
        _require(
            bool(self.agent) or not self.agent_kwargs,
            f"episode.agent_kwargs={self.agent_kwargs} is set but episode.agent is not: they "
            "are the keyword arguments of the agent episode.agent names",
        )
        _bound(self, "episode.agent_timeout_s", gt=0)
        _bound(self, "episode.agent_port", ge=0, le=65535, hint=" (0 = a free port)")
        _require(
            self.agent_export in AGENT_EXPORTS,
            f"episode.agent_export={self.agent_export!r}: give one of {', '.join(AGENT_EXPORTS)}",
        )
        _require(
            _is_loopback_ip(self.agent_bind),
            f"episode.agent_bind={self.agent_bind!r}: the agent endpoint binds a loopback "
            "address only (127.0.0.1 or ::1): its per-episode keys travel in clear and the "
            "agents run on the actor's host",
        )
        _require(bool(self.agent_model), "episode.agent_model must be a non-empty model id")

    def token_budget(self, turn_tokens: int) -> int:
        """Response tokens one episode may hold: ``max_tokens``, or for 0 ``max_turns x
        turn_tokens`` (``sampling.max_tokens``)."""
        return self.max_tokens or self.max_turns * turn_tokens


def _is_loopback_ip(host: str) -> bool:
    """A loopback IP address (``127.x``, ``::1``); a name (``localhost``) is not one: it
    could resolve elsewhere."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
