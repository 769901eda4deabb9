"""Reward functions that fail in the ways users meet, for
tests/e2e/test_reward_failures.py; specs ``tests/e2e/bad_rewards.py:<name>``."""

import itertools
import math
import os
import time
from pathlib import Path

_calls = itertools.count()


def two_args(prompt, completion):
    """Wrong signature: the task's fields (``a``, ``b``, ``answer``) have nowhere to go."""
    return 0.0


def raises(prompt, completion, **fields):
    raise RuntimeError("reward server said no")


def mostly_raises(prompt, completion, **fields):
    """Raises on 3 calls of every 4 (per worker process): not all of the first calls fail, so
    only the error-rate window can stop the run."""
    if next(_calls) % 4 != 3:
        raise RuntimeError("reward server said no")
    return 1.0


def fails_three_ways(prompt, completion, **fields):
    """Every call fails, in turn: raises, returns a string, returns NaN (the turns count per
    worker process, each of which calls the reward one call at a time)."""
    turn = next(_calls) % 3
    if turn == 0:
        raise RuntimeError("reward server said no")
    return "1.0" if turn == 1 else math.nan


def sleeps(prompt, completion, **fields):
    """Touches ``$REWARD_MARK`` (if set), then sleeps ``$REWARD_SLEEP_S`` seconds (default
    30) and returns 0.5."""
    mark = os.environ.get("REWARD_MARK")
    if mark:
        Path(mark).touch()
    time.sleep(float(os.environ.get("REWARD_SLEEP_S", "30")))
    return 0.5
