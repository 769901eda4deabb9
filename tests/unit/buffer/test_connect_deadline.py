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
