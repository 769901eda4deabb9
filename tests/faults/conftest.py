"""Fault-injection tests (issue 5): real redis-server, real processes, real signals.

Counts are reduced by default so ``make test`` stays well under CI's budget; the issue's full
counts (50 actor kills, 20 learner restarts, 20 Redis restarts, ...) run with
``make test-faults-full`` (``ASYNCRL_FAULTS_FULL=1``). Every test has a hard wall-clock bound.
"""

from __future__ import annotations

import os

import pytest

FULL = os.environ.get("ASYNCRL_FAULTS_FULL", "") == "1"


def fault_count(reduced: int, full: int) -> int:
    """The number of faults to inject: ``full`` under ASYNCRL_FAULTS_FULL=1, else ``reduced``."""
    return full if FULL else reduced


@pytest.fixture
def counts():
    """``counts(reduced, full)`` -> the count for this run (see module docstring)."""
    return fault_count
