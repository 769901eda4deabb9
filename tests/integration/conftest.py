"""Tests against a real redis-server use the fixtures of tests/conftest.py: ``redis_server``,
``redis_client``, ``buffer_name``, ``redis_binary``. Here: ``loop``, the event loop that a
module's vLLM engine and its calls share."""

import asyncio

import pytest


@pytest.fixture(scope="module")
def loop():
    """One asyncio loop for the module (an engine started on it is used from it)."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()
