"""Fail the run when the environment keeps failing, as rewards do (``task.max_reward_error_frac``).

An episode the environment ended (``env_timeout``, ``env_error``) is counted and trains what it
has; one in a while is the environment's business. But an environment that fails most of its
episodes (a dead sandbox service, a bug in ``step``) would train a run on placeholders for
hours. ``FailureGuard.add`` looks at the last ``episode.env_failure_window`` episodes of an
actor and raises ``EnvFailureRate`` (the actor exits non-zero; the launcher does not restart
it) once more than ``episode.max_env_failure_frac`` of them failed, naming the environment, the
first failure and the fix. An agent (``episode.agent``) is guarded the same way: its failures
are ``agent_error``, ``agent_timeout`` and ``no_call`` (it returned without calling the model).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncrl.core.runtime.error_window import ErrorWindow
from asyncrl.core.runtime.fatal import FatalError

FAILED_ENDS = ("env_timeout", "env_error", "agent_error", "agent_timeout", "no_call")
"""The ends that count as the environment's (or the agent's) failures."""


class EnvFailureRate(FatalError):
    """More than ``episode.max_env_failure_frac`` of an actor's recent episodes failed."""


@dataclass
class FailureGuard:
    """``add(end, error)`` per finished episode; raises ``EnvFailureRate`` when more than
    ``frac`` of the last ``size`` episodes ended in ``FAILED_ENDS`` (``ErrorWindow``'s
    invariant: before ``size`` episodes the missing ones count as successes; 1.0 never trips).
    ``what`` names the environment in the message (``episode.env=...``, or
    ``episode.agent=...``: then the message speaks of the agent and its timeout)."""

    frac: float
    size: int
    what: str
    first: str = ""
    """The first failure's ``end: error``."""
    window: ErrorWindow = field(init=False)

    def __post_init__(self) -> None:
        self.window = ErrorWindow(self.frac, self.size)

    def add(self, end: str, error: str = "") -> None:
        failed = end in FAILED_ENDS
        if failed and not self.first:
            self.first = f"{end}: {error}" if error else end
        if self.window.add(failed, end if failed else ""):
            raise EnvFailureRate(self.message())

    def message(self) -> str:
        w = self.window
        agent = self.what.startswith("episode.agent")
        noun = "agent" if agent else "environment"
        timeout = "episode.agent_timeout_s" if agent else "episode.env_timeout_s"
        slow = "it" if agent else "its step"
        fix = f"Fix the {noun} (a timeout: make {slow} faster or raise {timeout})"
        ends = "/".join(FAILED_ENDS[2:] if agent else FAILED_ENDS[:2])
        if w.fast:
            return (
                f"the {noun} ({self.what}) ended each of the first {w.first} episodes the "
                f"same way; first: {self.first}. {fix}, or set "
                f"episode.max_env_failure_frac=1.0 to never fail on {noun} failures"
            )
        return (
            f"the {noun} ({self.what}) ended {w.errors} of the last {w.size} episodes "
            f"with {ends} ({w.errors / w.size:.0%}, more than "
            f"episode.max_env_failure_frac={self.frac:g} of episode.env_failure_window="
            f"{w.size}); first: {self.first}. {fix}, or raise episode.max_env_failure_frac "
            f"(1.0 = never fail on {noun} failures)"
        )
