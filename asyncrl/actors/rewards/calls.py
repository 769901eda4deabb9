"""Calling a reward function safely: one call -> ``Scored`` (value, error kind and reason,
extras); a user's function never kills the actor.

A call that fails scores 0 with a reason ``"<kind>: <message>"`` (``Sample.reward_error``),
``<kind>`` one of ``asyncrl.learner.hub.reward_records.REWARD_ERROR_KINDS``; ``error_kind`` there reads it
back (the learner's summary counts errors by kind). Actors call the function through ``asyncrl.actors.rewards.scoring.RewardScorer``
(off the event loop, with a deadline).
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass, field

from asyncrl.actors.rewards.loading import RewardFn, fn_name
from asyncrl.actors.rewards.sandbox import SandboxError
from asyncrl.core.types import MAX_ABS_REWARD, MAX_REWARD_EXTRAS


@dataclass(frozen=True)
class Scored:
    """The outcome of one reward call."""

    value: float
    """The reward; 0.0 when the call failed."""
    kind: str = ""
    """"" on success, else one of ``REWARD_ERROR_KINDS``."""
    reason: str = ""
    """"" on success, else ``"<kind>: <message>"`` (one line; stored in the group)."""
    detail: str = ""
    """For the actor's log: the traceback of a raise, the repr of a bad return value."""
    extras: dict[str, float] = field(default_factory=dict)
    """A dict result's other numeric values (``Sample.reward_extras``); {} on failure."""


def score_call(fn: RewardFn, prompt: str, completion: str, fields: dict | None = None) -> Scored:
    """Call ``fn(prompt, completion, **fields)`` and classify the outcome. Raises only
    ``SandboxError`` (this machine cannot confine model-written code: no sample can be scored).
    """
    try:
        out = fn(prompt, completion, **(fields or {}))
    except SandboxError:  # the machine cannot confine code: a setup error, not a 0 reward
        raise
    except (Exception, KeyboardInterrupt, SystemExit) as exc:  # a user's reward function
        # must not kill the actor or its worker. KeyboardInterrupt/SystemExit come from the
        # function itself: no signal raises them here (the actor handles SIGINT on its loop,
        # workers run in sessions of their own); formerly each killed its worker process
        # and printed a bare traceback, 131 of them in one run
        said = f": {exc}" if str(exc) else ""
        message = f"reward function raised {type(exc).__name__}{said}"
        return _failed("raised", message, "".join(traceback.format_exception(exc)))

    try:
        value, extras = check_score(out)
    except ScoreError as e:  # only now: naming the function is not free (~0.3 ms)
        return _failed(e.kind, str(e), f"{fn_name(fn)} returned {short_repr(out)}")
    return Scored(value, extras=extras)


class ScoreError(ValueError):
    """A returned reward the learner cannot take; ``kind`` is one of ``missing_score``,
    ``wrong_type``, ``non_finite``, ``out_of_range`` (``REWARD_ERROR_KINDS``), the message
    says what was wrong and, where it helps, the fix."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def check_score(out: object) -> tuple[float, dict[str, float]]:
    """``(reward, extras)`` of what a reward function (or an agent) returned: a number (not a
    bool) or a dict with a number under ``"score"`` (its other numbers: ``reward_extras``);
    finite, within +-``MAX_ABS_REWARD``. ``ScoreError`` otherwise. One rule for every scorer:
    ``score_call`` and ``agents.spec.check_result``."""
    if isinstance(out, dict) and "score" not in out:
        keys = sorted(map(str, out))
        raise ScoreError("missing_score", f"reward dict has no 'score' key (keys: {keys})")
    value = out.get("score") if isinstance(out, dict) else out
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        message = f"reward is {type(value).__name__}, expected a float or a dict with 'score'"
        raise ScoreError("wrong_type", message)
    value = float(value)
    if not math.isfinite(value):
        raise ScoreError("non_finite", f"reward is not finite: {value}")
    if abs(value) > MAX_ABS_REWARD:
        raise ScoreError(
            "out_of_range",
            f"reward {value:g} is beyond +-{MAX_ABS_REWARD:g} (advantages and the loss would "
            "overflow float32); return rewards on a small scale, e.g. 0..1",
        )
    return value, reward_extras(out) if isinstance(out, dict) else {}


def reward_extras(result: dict) -> dict[str, float]:
    """A dict result's values other than ``"score"`` that are finite numbers (bools as 0/1),
    by key; the first ``MAX_REWARD_EXTRAS`` keys in sorted order. Anything else is ignored
    (``python_code_reward``'s ``"sandbox"`` reason, verl's ``"pred"`` string)."""
    out = {}
    for key in sorted(k for k in result if isinstance(k, str) and k and k != "score"):
        value = result[key]
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[key] = float(value)
            if len(out) == MAX_REWARD_EXTRAS:
                break
    return out


def score(
    fn: RewardFn, prompt: str, completion: str, fields: dict | None = None
) -> tuple[float, str]:
    """``score_call`` as ``(reward, "")``, or ``(0.0, reason)`` if the call failed."""
    s = score_call(fn, prompt, completion, fields)
    return s.value, s.reason


def _failed(kind: str, message: str, detail: str = "") -> Scored:
    return Scored(0.0, kind, f"{kind}: {' '.join(message.split())[:500]}", detail)


def short_repr(value: object, limit: int = 200) -> str:
    """``repr(value)``, cut to ``limit`` characters (for messages about a returned value)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
