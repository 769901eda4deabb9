"""Fault-injection tests: real redis-server, real processes, real signals.

Counts are reduced by default so ``make test`` stays well under CI's budget; the full
counts (50 actor kills, 20 learner restarts, 20 Redis restarts, ...) run with
``make test-faults-full`` (``ASYNCRL_FAULTS_FULL=1``). Every test has a hard wall-clock bound.
"""

from __future__ import annotations

import json
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


# -- shared by the actor and supervision fault tests ----------------------------------------


@pytest.fixture(scope="module")
def sim_model_dir(tmp_path_factory) -> str:
    """A model directory for the simulated engine: the demo tokenizer and a config.json."""
    from asyncrl.orchestration.demo.tokenizer import save_tokenizer

    path = tmp_path_factory.mktemp("sim_model")
    tok = save_tokenizer(path)
    (path / "config.json").write_text(json.dumps({"vocab_size": len(tok)}))
    return str(path)


@pytest.fixture
def announced_learner(redis_client, buffer_name):
    """A real ZeroMQ control server announced in the buffer's meta, as the learner does."""
    from asyncrl.core.net.control import ControlServer

    server = ControlServer()
    redis_client.hset(f"{buffer_name}:meta", mapping=server.meta())
    yield server
    server.close()
