"""The job on separate hosts (network namespaces joined by a bridge): the learner across two
hosts (torchrun, 2 nodes x 1 rank), the actors on a third, Redis on a fourth, an outsider
without keys on a fifth. Real ``asyncrl launch`` commands, real Redis, real gloo, simulated
engines (the model-free ``actor.engine=sim``: the network is what is under test)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.multihost.cluster import HOSTS, Cluster, check_conservation

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.multihost]

STEPS = 150  # ~0.3 s each at actor.sim_tokens_per_s=300: the probes run while it trains
OUTSIDER = Path(__file__).with_name("outsider.py")


@pytest.fixture
def cluster(hosts_factory, roles, tmp_path):
    return Cluster(hosts_factory(HOSTS), roles, tmp_path)


def _control(learner0_log: str) -> str:
    m = re.search(r"control plane on (tcp://\S+)", learner0_log)
    assert m, learner0_log[-2000:]
    return m.group(1)


@pytest.mark.timeout(600)
def test_job_trains_across_hosts_listens_only_where_configured_and_ignores_an_outsider(cluster):
    roles, hosts = cluster.roles, cluster.hosts
    cluster.start_buffer()
    learners = cluster.start_learner(f"learner.steps={STEPS}")
    actors = cluster.start_actors("actor.num_actors=2", "actor.sim_tokens_per_s=300")
    first = roles.wait_line(learners[0], "step    1 ", 300)
    assert first

    # Only the configured interface (and loopback for metrics) listens, on every host.
    for host in ("learner0", "learner1", "actors", "redis"):
        own = hosts.addr(host)
        found = cluster.listeners(host)
        assert found, host
        stray = [s for s in found if s[0] not in (own, "127.0.0.1")]
        assert not stray, f"{host} listens beyond {own} and loopback: {stray}"
        metrics = [s for s in found if s[0] == "127.0.0.1"]
        assert all(9490 <= port < 9500 for _, port, _ in metrics), (host, metrics)

    # An outsider knowing every address (and the server's public key) gets nowhere.
    meta = cluster.meta()
    keys = json.loads(meta["control_keys"])
    redis_host, redis_port = (
        cluster.url_file("actor").read_text().strip().rsplit("@")[1][:-2].split(":")
    )
    probe = hosts.run("outsider", [sys.executable, str(OUTSIDER), redis_host, redis_port,
                                   meta["control_addr"], keys["server_public"]], timeout=60)  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    result = json.loads(probe.stdout)
    assert result["redis"] == {"no_password": "AuthenticationError",
                               "wrong_password": "AuthenticationError"}, result  # fmt: skip
    assert result["control_plain"] in ("NOT_ADMITTED", "NO_ANSWER"), result
    assert result["control_curve_other_key"] in ("NOT_ADMITTED", "NO_ANSWER"), result

    for proc in learners:
        assert roles.wait(proc, 300) == 0, proc.tail(60)
    assert roles.wait(actors, 120) == 0, actors.tail(60)
    summary = cluster.summary()
    check_conservation(summary)
    assert summary["final_version"] == STEPS and summary["groups_trained"] == STEPS * 4
    assert summary["max_trained_staleness"] <= 1
    assert summary["weight_sync"]["failures"] == 0
    stats = cluster.actor_stats()
    assert sorted(stats) == [0, 1], stats
    for i, s in stats.items():  # every sync reached every actor
        assert s["version"] == STEPS and s["weight_syncs"] == STEPS and s["duplicates"] == 0, (i, s)
    log = learners[0].output()
    assert "actor 99" not in log and "98" not in re.findall(r"actors? \[[^\]]*\]", log), log
    assert meta["control_addr"].startswith(f"tcp://{hosts.addr('learner0')}:")
