"""``buffer.tls_dir``: the job's Redis over TLS only (buffer/service/tls.py, ``RedisOptions(tls=)``),
against a real redis-server: the files made or checked, role URLs that verify the server,
and clear errors for a plain client, a wrong CA and a certificate for another address."""

from __future__ import annotations

import random
import stat
import time

import pytest
import redis

from asyncrl.buffer.connection import BufferUnavailable, connect, describe
from asyncrl.buffer.redis_buffer import ReplayBuffer
from asyncrl.buffer.service.server import RedisOptions, RedisServer
from asyncrl.buffer.service.tls import TlsError, ensure
from asyncrl.buffer.testing import random_group

pytestmark = pytest.mark.redis


def _quiet(_text: str) -> None:
    pass


def test_files_are_made_private_then_reused_and_checked(tmp_path):
    said = []
    files = ensure(tmp_path / "tls", ["127.0.0.1"], say=said.append)
    assert "made a private CA" in said[0] and str(files.ca) in said[0]
    for path, mode in ((files.key, 0o600), (files.ca.with_name("ca.key"), 0o600),
                       (files.cert, 0o644), (files.ca, 0o644)):  # fmt: skip
        assert stat.S_IMODE(path.stat().st_mode) == mode, path
    before = files.cert.read_bytes()
    assert ensure(tmp_path / "tls", ["127.0.0.1"], say=said.append) == files
    assert files.cert.read_bytes() == before and len(said) == 1  # reused, not re-made
    with pytest.raises(
        TlsError, match=r"does not name 10\.9\.8\.7 \(it names \['127\.0\.0\.1'\]\)"
    ):
        ensure(tmp_path / "tls", ["10.9.8.7"], say=_quiet)
    files.key.unlink()
    with pytest.raises(TlsError, match="lacks .*redis.key; give all of"):
        ensure(tmp_path / "tls", ["127.0.0.1"], say=_quiet)


def test_roles_reach_a_tls_only_server_and_plain_or_unverified_clients_are_refused(
    tmp_path, redis_binary
):
    files = ensure(tmp_path / "tls", ["127.0.0.1"], say=_quiet)
    server = RedisServer(tmp_path / "redis", RedisOptions(tls=files), key_prefix="t").start()
    try:
        assert server.url.startswith("rediss://") and f"ssl_ca_certs={files.ca}" in server.url
        actor = ReplayBuffer(connect(server.url_for("actor")), "t", capacity=4)
        learner = ReplayBuffer(connect(server.url_for("learner")), "t", capacity=4)
        assert describe(actor.client).startswith("rediss://")
        group = random_group(random.Random(0), "0:1", vocab_size=50)
        assert actor.commit(actor.lease(0, 1.0), group)
        (entry,) = learner.read("learner", 4, 0)
        assert entry.group.group_id == "0:1"

        plain = f"redis://:{server.password}@127.0.0.1:{server.port}/0"
        with pytest.raises(BufferUnavailable, match="closes plain connections.*rediss://") as e:
            connect(plain, timeout_s=1.5)
        assert server.password not in str(e.value)
        with pytest.raises(redis.ConnectionError):  # no plain listener on any port of ours
            redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=2).ping()

        other = ensure(tmp_path / "other", ["127.0.0.1"], say=_quiet)  # another job's CA
        t0 = time.monotonic()
        with pytest.raises(BufferUnavailable, match="TLS certificate that does not verify"):
            connect(server.url.replace(str(files.ca), str(other.ca)), timeout_s=10)
        assert time.monotonic() - t0 < 3, "a certificate failure is not retried"

        server.stop()
        server.start()  # a restart keeps TLS and the port the URLs name
        assert connect(server.url).ping()
        assert "tls-port" in server.conf_path.read_text()
    finally:
        server.stop()


def test_a_certificate_for_another_address_is_refused_by_name(tmp_path, redis_binary):
    files = ensure(tmp_path / "tls", ["10.9.8.7"], say=_quiet)  # not the address we dial
    # its own check skips names
    server = RedisServer(tmp_path / "redis", RedisOptions(tls=files)).start()
    try:
        with pytest.raises(BufferUnavailable, match="does not verify.*IP address mismatch"):
            connect(server.url, timeout_s=5)
    finally:
        server.stop()
