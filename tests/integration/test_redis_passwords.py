"""A real redis-server on ``buffer.port`` with the ACL users' passwords of
``buffer.passwords_dir`` (how the Kubernetes buffer pod runs): the roles' users log in with
the given passwords at that port, and a restart with new files takes the new passwords."""

from __future__ import annotations

import pytest

from asyncrl.buffer.connection import BufferUnavailable, connect
from asyncrl.core.config.load import load_config
from asyncrl.core.runtime.torchrun import free_port
from asyncrl.orchestration.launch.buffer_start import redis_server

pytestmark = pytest.mark.redis


def write_passwords(directory, suffix: str) -> dict[str, str]:
    directory.mkdir(exist_ok=True)
    passwords = {"actor": f"actor-password-{suffix}", "learner": f"learner-password-{suffix}"}
    for user, text in passwords.items():
        path = directory / user
        if path.exists():
            path.chmod(0o600)
        path.write_text(text)
        path.chmod(0o400)
    return passwords


def test_the_given_passwords_log_in_at_the_given_port_and_a_restart_takes_new_ones(
    tmp_path, redis_binary
):
    port, secret = free_port(), tmp_path / "secret"
    cfg = load_config([f"buffer.port={port}", f"buffer.passwords_dir={secret}", "buffer.name=k8s"])
    old = write_passwords(secret, "one")
    server = redis_server(cfg, tmp_path / "run").start()
    try:
        assert server.port == port
        for user, password in old.items():
            client = connect(f"redis://{user}:{password}@127.0.0.1:{port}/0", timeout_s=5)
            client.exists("k8s:meta")  # the user may touch its buffer's keys
            client.close()
    finally:
        server.stop()
    new = write_passwords(secret, "two")  # the Secret changed; the buffer pod restarts
    server = redis_server(cfg, tmp_path / "run").start()
    try:
        connect(f"redis://actor:{new['actor']}@127.0.0.1:{port}/0", timeout_s=5).close()
        with pytest.raises(BufferUnavailable, match="refused the password"):
            connect(f"redis://actor:{old['actor']}@127.0.0.1:{port}/0", timeout_s=2)
    finally:
        server.stop()
