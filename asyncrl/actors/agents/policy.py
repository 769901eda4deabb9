"""The sampling settings of one agent call: the run's, whatever the request asks.

The tokens an agent's calls sample are trained as samples of the run's behaviour policy, so
a call samples as ``sampling.*`` says (validation: greedy at ``eval.n_samples=1``, else
``eval.temperature``), not as the agent asked. What the request asked and did not get is
counted by name in ``CallSettings.overrides``:

    temperature, top_p, top_k         the run's            counted when given and different
    max_tokens, max_completion_tokens min(asked, the cap)  counted as max_tokens when cut
    stop                              the run's + the call's (text ends; tokens still sampled
                                      by the policy)      counted as stop_added
    seed                              episode seed + call index     counted when given
    penalties, logit_bias, min_p, response_format, guided_*, tool_choice required / named
                                      ignored: they change the distribution  counted
    n > 1, top_logprobs > 0, stream_options not an object   refused (400 naming the field)
    stream, logprobs                  served from the record (server.py, reply_format.py)

The budget and context left cap ``max_tokens`` further; that is the episode's
(``record.AgentEpisode.plan``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from asyncrl.actors.agents.messages import Refused
from asyncrl.core.config.sampling import SamplingConfig
from asyncrl.core.config.task import EvalConfig

NEUTRAL: dict[str, Any] = {
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "repetition_penalty": 1,
    "logit_bias": {},
    "min_p": 0,
    "response_format": {"type": "text"},
    "guided_json": None,
    "guided_regex": None,
    "guided_choice": None,
    "guided_grammar": None,
    "structured_outputs": None,
}
"""Parameters that change the sampled distribution, ignored; a value other than its neutral
one (or None) is counted as an override."""

REFUSED = ("top_logprobs",)
"""Not recorded (the engine samples without alternatives): a truthy value is refused."""


@dataclass(frozen=True)
class CallSettings:
    """What one call samples with: at most ``max_tokens`` new tokens at ``temperature`` with
    ``Engine.generate``'s ``options`` (top_p, top_k, stop); ``overrides`` maps each asked
    parameter not honoured to what was asked."""

    max_tokens: int
    temperature: float
    options: dict[str, Any]
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CallPolicy:
    """The run's sampling for agent calls: at most ``max_tokens`` per call (>= 1), at
    ``temperature`` (0 = greedy), with ``options`` (``SamplingConfig.engine_options()``, or
    none for validation, which samples without them)."""

    max_tokens: int
    temperature: float
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"CallPolicy.max_tokens={self.max_tokens}: at least 1")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"CallPolicy.temperature={self.temperature}: finite and >= 0")

    @classmethod
    def train(cls, s: SamplingConfig) -> CallPolicy:
        """Training calls: ``sampling.*``."""
        return cls(s.max_tokens, s.temperature, s.engine_options())

    @classmethod
    def eval(cls, s: SamplingConfig, ev: EvalConfig) -> CallPolicy:
        """Validation calls, as validation samples a completion: greedy for one sample,
        else ``eval.temperature``; no top_p / top_k / stop."""
        return cls(s.max_tokens, 0.0 if ev.n_samples == 1 else ev.temperature, {})

    def resolve(self, body: dict[str, Any]) -> CallSettings:
        """The settings of the request ``body`` (see the module docstring); ``Refused``
        naming the field for ``n > 1``, ``top_logprobs``, a bad ``stream_options`` or a bad
        ``max_tokens``."""
        _refuse(body)
        overrides: dict[str, Any] = {}
        _sampling(self, body, overrides)
        options = dict(self.options)
        stops = _stops(body.get("stop"))
        if stops:
            options["stop"] = [*options.get("stop", []), *stops]
            overrides["stop_added"] = stops
        if body.get("seed") is not None:
            overrides["seed"] = body["seed"]
        for name, neutral in NEUTRAL.items():
            if body.get(name) is not None and body[name] != neutral:
                overrides[name] = body[name]
        choice = body.get("tool_choice")
        if choice is not None and choice not in ("auto", "none"):
            overrides["tool_choice"] = choice
        return CallSettings(
            _max_tokens(self, body, overrides), self.temperature, options, overrides
        )


def _refuse(body: dict[str, Any]) -> None:
    n = body.get("n")
    if n is not None and n != 1:
        raise Refused("n", f"n={n}: one completion per call (call again for another sample)")
    for name in REFUSED:
        if body.get(name):
            raise Refused(name, f"{name}: not served by this endpoint; leave it unset")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise Refused("stream_options", 'stream_options: an object, e.g. {"include_usage": true}')


def _sampling(policy: CallPolicy, body: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Count temperature / top_p / top_k asked other than the run's."""
    run = {"temperature": policy.temperature, "top_p": 1.0, "top_k": -1, **policy.options}
    for name in ("temperature", "top_p", "top_k"):
        asked = body.get(name)
        if asked is not None and asked != run[name]:
            overrides[name] = asked


def _stops(stop: Any) -> list[str]:
    """The request's ``stop``: a string or a list of strings (empty ones dropped)."""
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise Refused("stop", "stop: a string or a list of strings")
    return [s for s in stops if s]


def _max_tokens(policy: CallPolicy, body: dict[str, Any], overrides: dict[str, Any]) -> int:
    """``min(asked, policy.max_tokens)``; a cut is counted as ``max_tokens``."""
    asked = [
        (name, body[name])
        for name in ("max_tokens", "max_completion_tokens")
        if body.get(name) is not None
    ]
    for name, value in asked:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise Refused(name, f"{name}={value!r}: a whole number >= 1")
    want = min((v for _, v in asked), default=policy.max_tokens)
    if want > policy.max_tokens:
        overrides["max_tokens"] = want
    return min(want, policy.max_tokens)
