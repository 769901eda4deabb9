"""Tests against a real redis-server use the fixtures of tests/conftest.py: ``redis_server``,
``redis_client``, ``buffer_name``, ``redis_binary``."""
