"""Run in a host holding no key: try the job's Redis and control plane; print what happened
as JSON. ``python outsider.py REDIS_HOST REDIS_PORT CONTROL_ADDR SERVER_PUBLIC_KEY``.

The outsider knows every address and even the server's public key (a CURVE client needs it;
it is not a secret), but none of the job's passwords or its client key pair."""

from __future__ import annotations

import json
import socket
import sys
import time

import redis
import zmq


def redis_attempts(host: str, port: int) -> dict[str, str]:
    out = {}
    for label, password in (("no_password", None), ("wrong_password", "guess")):
        try:
            c = redis.Redis(host=host, port=port, password=password, socket_timeout=5)
            c.hset("mh:meta", "control_addr", "tcp://evil:1")
            out[label] = "WROTE"
        except redis.RedisError as e:
            out[label] = type(e).__name__
    return out


def control_attempt(address: str, server_public: str, curve: bool) -> str:
    """Register as actor 99 and ask for weights; 'ANSWERED' if the learner replied."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if curve:
        public, secret = zmq.curve_keypair()  # a key pair of its own: not the job's
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = (
            server_public.encode(), public, secret)  # fmt: skip
    sock.connect(address)
    time.sleep(1.0)  # the handshake (which the server refuses)
    try:
        sock.send(json.dumps({"type": "register", "actor_id": 99}).encode(), zmq.NOBLOCK)
        sock.send(json.dumps({"type": "updated", "actor_id": 99, "version": 10**6}).encode(),
                  zmq.NOBLOCK)  # fmt: skip
    except zmq.Again:  # no connection was ever admitted: nothing could be queued
        sock.close(0)
        ctx.term()
        return "NOT_ADMITTED"
    answered = sock.poll(3000)
    sock.close(0)
    ctx.term()
    return "ANSWERED" if answered else "NO_ANSWER"


def raw_junk(address: str) -> str:
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"\xff" * 64 + b'{"type": "register", "actor_id": 98}')
        time.sleep(0.5)
    return "SENT"


def main() -> None:
    host, port, control, server_public = sys.argv[1:5]
    result = {
        "redis": redis_attempts(host, int(port)),
        "control_plain": control_attempt(control, server_public, curve=False),
        "control_curve_other_key": control_attempt(control, server_public, curve=True),
        "control_raw_tcp": raw_junk(control),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
