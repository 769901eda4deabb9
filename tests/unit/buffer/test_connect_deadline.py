"""``asyncrl.buffer.connection.connect`` keeps its deadline when the address accepts TCP connections
but never answers (not Redis, or a hung server), and says so."""

from __future__ import annotations

import socket
import time

import pytest

from asyncrl.buffer.connection import BufferUnavailable, connect


@pytest.mark.timeout(30)
def test_a_silent_listener_fails_within_the_deadline_and_says_it_is_not_redis():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # accepts (the kernel completes the handshake), never answers
        port = listener.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(BufferUnavailable) as err:
            connect(f"redis://:pw@127.0.0.1:{port}/0", timeout_s=2.0)
        took = time.monotonic() - t0
    assert took < 4.0, f"took {took:.1f}s for a 2 s deadline"
    assert "after 2.0s" in str(err.value)
    assert "does not answer like Redis" in str(err.value)
    assert ":pw@" not in str(err.value)  # the password stays masked


@pytest.mark.timeout(30)
def test_a_role_waiting_for_redis_at_start_says_so_once_and_keeps_its_deadline():
    """A restarted role may meet Redis away (the chaos run: an actor restarted while the Redis
    host was cut off died at the old 10 s deadline); roles now wait ``buffer.reconnect_s``,
    saying so at the first failed try, not silently."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: connections are refused
    said: list[str] = []
    t0 = time.monotonic()
    with pytest.raises(BufferUnavailable, match="after 1.5s"):
        connect(f"redis://:pw@127.0.0.1:{port}/0", timeout_s=1.5, say=said.append)
    assert 0.5 < time.monotonic() - t0 < 4.0  # it stops a back-off step early
    assert len(said) == 1 and "retrying for up to 2 s (buffer.reconnect_s)" in said[0], said
    assert ":pw@" not in said[0]
