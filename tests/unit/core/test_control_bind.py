"""A ``ControlServer`` (asyncrl/core/net/control.py) that cannot bind says which address and config key
to fix, and leaves nothing behind: no ZAP authentication thread, no zmq context."""

from __future__ import annotations

import socket
import threading

import pytest
from zmq.auth.thread import AuthenticationThread

from asyncrl.core.net.control import ControlServer
from asyncrl.core.runtime.fatal import FatalError


def _auth_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if isinstance(t, AuthenticationThread)]


def test_an_address_not_on_this_host_is_fatal_and_leaves_nothing():
    before = len(_auth_threads())
    with pytest.raises(FatalError) as e:
        ControlServer("192.0.2.1")  # TEST-NET-1: documentation only, never a host's address
    text = str(e.value)
    assert "tcp://192.0.2.1:" in text and "network.bind='192.0.2.1'" in text, text
    assert "not an address of this host" in text
    assert len(_auth_threads()) == before


def test_a_taken_port_names_it_and_leaves_nothing():
    before = len(_auth_threads())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError) as e:
            ControlServer("127.0.0.1", port=port)
    text = str(e.value)
    assert f"tcp://127.0.0.1:{port}" in text and "another process holds the port" in text
    assert "network.bind='127.0.0.1'" in text, text
    assert len(_auth_threads()) == before


def test_a_bound_server_still_starts_and_closes():
    before = len(_auth_threads())
    server = ControlServer("127.0.0.1")
    assert server.address.startswith("tcp://127.0.0.1:") and len(_auth_threads()) == before + 1
    server.close()
    assert len(_auth_threads()) == before
