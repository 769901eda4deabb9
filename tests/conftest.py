"""Shared fixtures. ``redis_server``: one private redis-server per test session."""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A started ``buffer.server.RedisServer`` (loopback, free port, password, AOF).

    Tests share it; give each test its own buffer name. Skips when redis-server is missing.
    """
    if shutil.which("redis-server") is None:
        pytest.skip("install redis-server (apt-get install -y redis-server) to run Redis tests")
    from buffer.server import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()
