"""Fixtures for tests against a real redis-server (see ``redis_server`` in tests/conftest.py)."""

from __future__ import annotations

import shutil
import uuid

import pytest


@pytest.fixture
def redis_client(redis_server):
    """A binary-safe client of the session's redis-server."""
    from buffer.connection import connect

    client = connect(redis_server.url, timeout_s=5.0)
    yield client
    client.close()


@pytest.fixture
def buffer_name() -> str:
    """A fresh key prefix, so tests sharing one server never see each other's data."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def redis_binary() -> str:
    """Path of redis-server, for tests that start their own server; skips when missing."""
    path = shutil.which("redis-server")
    if path is None:
        pytest.skip("install redis-server (apt-get install -y redis-server) to run Redis tests")
    return path
