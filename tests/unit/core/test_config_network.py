"""The network group and the secrets rules: loopback by default, clear errors for addresses
peers cannot use, Redis passwords required off loopback, never on argv off loopback."""

from __future__ import annotations

import os

import pytest

from asyncrl.core.config.job import Config, LearnerConfig
from asyncrl.core.config.load import ConfigError, config_from_json, config_to_json, load_config
from asyncrl.core.config.network import NetworkConfig, is_loopback
from asyncrl.orchestration.cli import secret_in_argv


def test_defaults_are_loopback():
    net = Config().network
    assert (net.bind, net.address, net.metrics, net.local) == ("127.0.0.1",) * 3 + (True,)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"bind": "node7"}, "is not an IPv4 address"),
        ({"bind": "0.0.0.0"}, "set network.advertise"),
        ({"bind": "0.0.0.0", "advertise": "node7"}, "set network.advertise"),
        ({"bind": "::1"}, "not an IPv4 address"),
        ({"metrics": "10.0.0.1"}, "no authentication"),
        ({"advertise": "bad host!"}, "neither an IP address nor a host name"),
    ],
)
def test_bad_addresses_are_refused_with_the_fix(kw, message):
    with pytest.raises(ValueError, match=message):
        NetworkConfig(**kw)


def test_wildcard_bind_uses_the_advertised_interface():
    net = NetworkConfig(bind="0.0.0.0", advertise="10.1.2.3")
    assert (net.address, net.interface, net.local) == ("10.1.2.3", "10.1.2.3", False)
    assert NetworkConfig(bind="10.0.0.5").interface == "10.0.0.5"


@pytest.mark.parametrize(
    ("host", "loop"), [("127.0.0.1", True), ("127.3.0.1", True), ("::1", True),  # IPv6 named
                       ("localhost", True), ("10.0.0.1", False), ("redis.internal", False)],
)  # fmt: skip
def test_is_loopback(host, loop):
    assert is_loopback(host) is loop


def test_multinode_learner_needs_an_endpoint_a_shared_checkpoint_dir_and_a_rank_below_nnodes():
    shared = {"checkpoint_dir": "/shared/ckpt"}
    with pytest.raises(ValueError, match="needs learner.rdzv_endpoint=HOST:PORT"):
        LearnerConfig(nnodes=2, **shared)
    with pytest.raises(ValueError, match="set learner.checkpoint_dir"):
        LearnerConfig(nnodes=2, rdzv_endpoint="10.0.0.1:29500")
    with pytest.raises(ValueError, match="learner.node_rank"):
        LearnerConfig(nnodes=2, node_rank=2, rdzv_endpoint="10.0.0.1:29500", **shared)
    cfg = LearnerConfig(nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29500", **shared)
    assert cfg.world_size == 2 * cfg.nproc


MULTINODE = ["learner.nnodes=2", "learner.rdzv_endpoint=10.0.0.1:1", "learner.checkpoint_dir=/s"]


def test_batch_splits_over_all_learner_nodes():
    with pytest.raises(ConfigError, match="over 6 learner rank"):
        load_config(["learner.nproc=3", *MULTINODE, "network.bind=10.0.0.1"])


def test_a_learner_across_nodes_cannot_stay_on_loopback():
    with pytest.raises(ConfigError, match="cannot reach loopback"):
        load_config(MULTINODE)
    load_config([*MULTINODE, "network.bind=10.0.0.1"])


def test_asyncrl_run_refuses_a_multinode_layout():
    from asyncrl.orchestration.launch.jobs import run_local

    for extra in (["actor.nnodes=2"], [*MULTINODE, "network.bind=10.0.0.1"]):
        with pytest.raises(ValueError, match="launch buffer\\|learner\\|actors` on each node"):
            run_local(load_config(extra))


def test_redis_without_password_is_refused_off_loopback():
    with pytest.raises(ConfigError, match="buffer.url has no password"):
        load_config(["buffer.url=redis://10.0.0.2:6379/0"])
    with pytest.raises(ConfigError, match="buffer.url has no password"):
        load_config(["buffer.url=redis://127.0.0.1:6379/0", "network.bind=10.0.0.1"])
    load_config(["buffer.url=redis://127.0.0.1:6379/0"])  # loopback only: allowed


def test_url_file_must_be_private(tmp_path):
    path = tmp_path / "redis.url"
    path.write_text("redis://actor:secret@10.0.0.2:6379/0\n")
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="readable by other users.*chmod 600"):
        load_config([f"buffer.url_file={path}"])
    os.chmod(path, 0o600)
    assert load_config([f"buffer.url_file={path}"]).buffer.url.endswith("@10.0.0.2:6379/0")
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config([f"buffer.url_file={tmp_path / 'missing'}"])


def test_written_config_holds_no_password(tmp_path):
    cfg = load_config(["buffer.url=redis://learner:s3cret@10.0.0.2:6379/0"])
    text = config_to_json(cfg)
    assert "s3cret" not in text and "learner:***@10.0.0.2" in text
    assert config_from_json(text).buffer.url == "redis://learner:***@10.0.0.2:6379/0"


def test_password_on_argv_is_an_error_off_loopback_and_a_warning_on_it():
    remote = ["buffer.url=redis://u:pw@10.0.0.2:1/0"]
    assert secret_in_argv(remote, load_config(remote)).startswith("buffer.url on the command")
    local = ["buffer.url=redis://u:pw@127.0.0.1:1/0"]
    assert secret_in_argv(local, load_config(local)).startswith("warning:")
    assert secret_in_argv(["buffer.url=redis://127.0.0.1:1/0"], Config()) == ""


def test_a_tls_url_whose_ca_file_is_missing_here_is_refused_with_the_fix(tmp_path):
    url = f"rediss://actor:pw@127.0.0.1:6390/0?ssl_ca_certs={tmp_path}/ca.crt"
    with pytest.raises(ConfigError, match=r"ssl_ca_certs=.*ca\.crt, which is not a file on this"):
        load_config([f"buffer.url='{url}'"])
    (tmp_path / "ca.crt").write_text("x")
    assert load_config([f"buffer.url='{url}'"]).buffer.url == url


def test_tls_dir_with_a_plain_url_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="buffer.tls_dir=.* but buffer.url is plain redis://"):
        load_config(["buffer.url=redis://actor:pw@127.0.0.1:6379/0", f"buffer.tls_dir={tmp_path}"])


def test_learner_node_0_must_hold_the_rendezvous_address():
    from asyncrl.orchestration.launch.preflight import check_rendezvous_host

    shared = ["learner.nnodes=2", "learner.checkpoint_dir=/shared/ckpt", "network.bind=10.0.0.5"]
    here = load_config([*shared, "learner.rdzv_endpoint=127.0.0.1:29500"])
    check_rendezvous_host(here)  # loopback is an address of every host
    away = load_config([*shared, "learner.rdzv_endpoint=192.0.2.7:29500"])  # TEST-NET-1
    with pytest.raises(ValueError, match=r"node 0 serves the rendezvous.*192\.0\.2\.7 is not an"):
        check_rendezvous_host(away)
    node1 = load_config([*shared, "learner.rdzv_endpoint=192.0.2.7:29500", "learner.node_rank=1"])
    check_rendezvous_host(node1)  # other nodes dial it
