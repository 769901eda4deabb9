"""Waits that say what they wait for, have a deadline and stop on request.

A role that waits (the learner for its actors or for data, an actor for its learner) holds a
``Wait`` and calls ``check()`` on every turn of its polling loop. ``check``

- raises ``StopRequested`` as soon as ``stop()`` is true (SIGTERM / Ctrl-C set it), so a
  waiting role exits in one poll interval instead of at its deadline;
- raises ``TimeoutError`` past the deadline, naming what it waited for and the fix;
- prints ``still waiting for <what> (<state>): <elapsed>s of <timeout>s`` every ``every_s``,
  so a person watching a log knows the role is alive, what it lacks, and when it gives up.

``begin`` prints the first line, ``waiting for <what>; giving up after <timeout>s`` (a wait
that is usually short, like the learner's wait for data, skips it and speaks only if it lasts).
Invariant: a wait is silent for at most ``every_s`` seconds plus one poll interval.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

REPORT_EVERY_S = 15.0
"""Seconds between two progress lines of one wait (at most 30 s, as users asked)."""


class StopRequested(Exception):
    """A stop was requested (SIGTERM / Ctrl-C) while the role waited; ``what`` says for what."""

    def __init__(self, what: str) -> None:
        super().__init__(f"stopped on request while waiting for {what}")
        self.what = what


def never() -> bool:
    """The default ``stop``: no stop is ever requested."""
    return False


@dataclass
class Wait:
    """One bounded, reported, interruptible wait (see the module docstring).

    ``what``: a noun phrase, e.g. ``"2 actor(s) to register"``. ``hint``: the fix, appended to
    the timeout error, raised as ``timeout_error``. ``say``: prints one line (with the role's
    prefix).
    """

    what: str
    timeout_s: float
    say: Callable[[str], None]
    stop: Callable[[], bool] = never
    hint: str = ""
    timeout_error: type[Exception] = TimeoutError
    every_s: float = REPORT_EVERY_S
    clock: Callable[[], float] = time.monotonic
    _t0: float = field(init=False, default=0.0)
    _last: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.every_s <= 0:
            raise ValueError(f"Wait needs timeout_s > 0 and every_s > 0, got {self}")
        self._t0 = self._last = self.clock()

    def begin(self, state: str = "") -> None:
        """Say that the wait starts, and its deadline."""
        self.say(f"waiting for {self.what}{_paren(state)}; giving up after {self.timeout_s:.0f}s")

    def check(self, state: str = "") -> None:
        """Raise on a stop request or past the deadline; else report every ``every_s``.

        ``state`` is what is known now, e.g. ``"1/2 registered: [0]"``.
        """
        if self.stop():
            raise StopRequested(self.what)
        now = self.clock()
        elapsed = now - self._t0
        if elapsed > self.timeout_s:
            msg = f"gave up waiting for {self.what}{_paren(state)} after {self.timeout_s:.0f}s"
            raise self.timeout_error(f"{msg}; {self.hint}" if self.hint else msg)
        if now - self._last >= self.every_s:
            self._last = now
            self.say(
                f"still waiting for {self.what}{_paren(state)}: "
                f"{elapsed:.0f}s of {self.timeout_s:.0f}s"
            )


def _paren(state: str) -> str:
    return f" ({state})" if state else ""
