"""A sliding count of recent failures, shared by rewards (``task.max_reward_error_frac``) and
environments (``episode.max_env_failure_frac``)."""

from __future__ import annotations

from collections import deque

FAIL_FAST_FIRST = 16
"""``ErrorWindow``'s fail-fast rule looks at this many first results (fewer for a smaller
window)."""
FAIL_FAST_MAX_FRAC = 0.5
"""The rule applies only at ``frac`` up to this (the default 0.5 and stricter): a user who
tolerates more failures (a remote judge warming up) keeps the window alone."""


class ErrorWindow:
    """Whether more than ``frac`` of the last ``size`` results failed, or the very first
    results all failed the same way.

    Invariants: ``add`` returns True iff (a) the errors among the last ``size`` results
    number more than ``frac * size`` (until ``size`` results were seen the missing ones count
    as successes, so it takes more than ``frac * size`` errors), or (b) ``frac <=
    FAIL_FAST_MAX_FRAC`` and the first ``first`` results (``min(FAIL_FAST_FIRST, size)``) all
    failed with one ``kind``
    (``fast`` is then True): a reward that always hangs tripped (a) only after 129 timeouts of
    60 s on 4 workers (32 minutes); (b) stops it after 16. ``frac = 1.0`` never trips.
    """

    def __init__(self, frac: float, size: int, first: int = FAIL_FAST_FIRST) -> None:
        if not 0.0 <= frac <= 1.0 or size < 1:
            raise ValueError(f"need 0 <= frac <= 1 and size >= 1, got frac={frac}, size={size}")
        self.frac, self.size = frac, size
        self.first = min(first, size)
        self._last: deque[bool] = deque(maxlen=size)
        self.errors = 0
        """Errors among the last ``size`` results."""
        self.seen = 0
        self._first_kinds: set[str] | None = set()
        """The kinds among the first results while all of them failed (None once one did not)."""
        self.fast = False
        """True once rule (b) tripped."""

    def add(self, failed: bool, kind: str = "") -> bool:
        """Count one result (``kind`` names a failure's kind); True if the window trips."""
        if len(self._last) == self.size:
            self.errors -= self._last[0]
        self._last.append(failed)
        self.errors += failed
        self.seen += 1
        if self.errors > self.frac * self.size:
            return True
        return self._first_all_failed(failed, kind)

    def _first_all_failed(self, failed: bool, kind: str) -> bool:
        if self._first_kinds is None or self.seen > self.first or self.frac > FAIL_FAST_MAX_FRAC:
            return False
        if not failed:
            self._first_kinds = None
            return False
        self._first_kinds.add(kind)
        self.fast = self.seen == self.first and len(self._first_kinds) == 1
        return self.fast
