"""Fail the run when the environment keeps failing, as rewards do (``task.max_reward_error_frac``).

An episode the environment ended (``env_timeout``, ``env_error``) is counted and trains what it
has; one in a while is the environment's business. But an environment that fails most of its
episodes (a dead sandbox service, a bug in ``step``) would train a run on placeholders for
hours. ``FailureGuard.add`` looks at the last ``episode.env_failure_window`` episodes of an
actor and raises ``EnvFailureRate`` (the actor exits non-zero; the launcher does not restart
it) once more than ``episode.max_env_failure_frac`` of them failed, naming the environment, the
first failure and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncrl.core.runtime.error_window import ErrorWindow
from asyncrl.core.runtime.fatal import FatalError

FAILED_ENDS = ("env_timeout", "env_error")
"""The ends that count as the environment's failures."""


class EnvFailureRate(FatalError):
    """More than ``episode.max_env_failure_frac`` of an actor's recent episodes failed."""


@dataclass
class FailureGuard:
    """``add(end, error)`` per finished episode; raises ``EnvFailureRate`` when more than
    ``frac`` of the last ``size`` episodes ended in ``FAILED_ENDS`` (``ErrorWindow``'s
    invariant: before ``size`` episodes the missing ones count as successes; 1.0 never trips).
    ``what`` names the environment in the message (``episode.env=...``)."""

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
        if w.fast:
            return (
                f"the environment ({self.what}) ended each of the first {w.first} episodes the "
                f"same way; first: {self.first}. Fix the environment (a timeout: make its step "
                "faster or raise episode.env_timeout_s), or set "
                "episode.max_env_failure_frac=1.0 to never fail on environment failures"
            )
        return (
            f"the environment ({self.what}) ended {w.errors} of the last {w.size} episodes "
            f"with env_timeout/env_error ({w.errors / w.size:.0%}, more than "
            f"episode.max_env_failure_frac={self.frac:g} of episode.env_failure_window="
            f"{w.size}); first: {self.first}. Fix the environment (a timeout: make its step "
            "faster or raise episode.env_timeout_s), or raise episode.max_env_failure_frac "
            "(1.0 = never fail on environment failures)"
        )
