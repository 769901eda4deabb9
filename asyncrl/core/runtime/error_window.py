"""A sliding count of recent failures, shared by rewards (``task.max_reward_error_frac``) and
environments (``episode.max_env_failure_frac``)."""

from __future__ import annotations

from collections import deque


class ErrorWindow:
    """Whether more than ``frac`` of the last ``size`` rewards failed.

    Invariant: ``add`` returns True iff the errors among the last ``size`` results number
    more than ``frac * size``. Until ``size`` results were seen the missing ones count as
    successes, so it takes more than ``frac * size`` errors to trip, and ``frac = 1.0``
    never trips.
    """

    def __init__(self, frac: float, size: int) -> None:
        if not 0.0 <= frac <= 1.0 or size < 1:
            raise ValueError(f"need 0 <= frac <= 1 and size >= 1, got frac={frac}, size={size}")
        self.frac, self.size = frac, size
        self._last: deque[bool] = deque(maxlen=size)
        self.errors = 0
        """Errors among the last ``size`` results."""

    def add(self, failed: bool) -> bool:
        if len(self._last) == self.size:
            self.errors -= self._last[0]
        self._last.append(failed)
        self.errors += failed
        return self.errors > self.frac * self.size
