"""The job on separate hosts (network namespaces joined by a bridge): the learner across two
hosts (torchrun, 2 nodes x 1 rank), the actors on a third, Redis on a fourth, an outsider
without keys on a fifth. Real ``asyncrl launch`` commands, real Redis, real gloo, simulated
engines (the model-free ``actor.engine=sim``: the network is what is under test)."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from tests.multihost.cluster import CLI, Cluster, check_conservation

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.multihost]

STEPS = 150  # ~0.3 s each at actor.sim_tokens_per_s=300: the probes run while it trains
OUTSIDER = Path(__file__).with_name("outsider.py")


def _control(learner0_log: str) -> str:
    m = re.search(r"control plane on (tcp://\S+)", learner0_log)
    assert m, learner0_log[-2000:]
    return m.group(1)


@pytest.mark.timeout(600)
def test_job_trains_across_hosts_listens_only_where_configured_and_ignores_an_outsider(cluster):
    roles, hosts = cluster.roles, cluster.hosts
    cluster.start_buffer()
    learners = cluster.start_learner(f"learner.steps={STEPS}")
    actors = cluster.start_actors("actor.sim_tokens_per_s=300")
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

    cluster.wait_job(learners, actors, 300)
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
    # both nodes' shards in the one shared checkpoint directory, sealed by rank 0
    final = cluster.tmp / "shared-checkpoints" / "checkpoints" / f"step_{STEPS:06d}"
    assert (final / "COMPLETE").is_file(), sorted(final.parent.iterdir())
    assert len(list((final / "dcp").glob("__*_*.distcp"))) == 2, list((final / "dcp").iterdir())


def _next_step(roles, proc, timeout_s: float = 120) -> None:
    """Wait for the learner's next ``step`` line."""
    mark = len(proc.output())
    roles.wait_until(lambda: re.search(r"^step ", proc.output()[mark:], re.M), timeout_s,
                     "the learner's next step")  # fmt: skip


def _read_traced(trace: Path, hit: int) -> bool:
    """Whether a learner's ``learner.after_read`` failpoint traced its ``hit``-th read."""
    lines = trace.read_text().splitlines() if trace.is_file() else []
    return any(json.loads(line)["hit"] == hit for line in lines if line.endswith("}"))


def _wait_step(roles, proc, step: int, timeout_s: float) -> None:
    roles.wait_line(proc, f"step {step:4d} ", timeout_s)


@pytest.mark.timeout(600)
def test_actor_host_killed_then_relaunched_loses_and_doubles_nothing(cluster):
    """Every process of the actors' host is SIGKILLed mid-run: the learner says so (its
    weight sync fails and it waits for groups), and carries on once the actors are launched
    again there (same run directory: same ids, same prompt cursors)."""
    roles, hosts = cluster.roles, cluster.hosts
    cluster.start_buffer()
    learners = cluster.start_learner("learner.steps=30", "learner.weight_sync_timeout_s=10",
                                     "buffer.lease_ttl_s=5")  # fmt: skip
    slow = ["actor.sim_tokens_per_s=300", "buffer.lease_ttl_s=5"]
    first = cluster.start_actors(*slow)
    _wait_step(roles, learners[0], 10, 300)
    roles.release(first)  # about to die
    hosts.kill_all("actors")
    mark = len(learners[0].output())  # the learner says so: a failed sync or a data wait
    said = re.compile(r"weight sync \d+ failed|still waiting for fresh groups")
    roles.wait_until(lambda: said.search(learners[0].output()[mark:]), 60, "the learner's report")
    cursors_before = cluster.meta()
    relaunched = cluster.start_actors(*slow, tag="actors")
    cluster.wait_job(learners, relaunched, 400)
    assert first.poll() is not None
    summary = cluster.summary()
    check_conservation(summary)
    assert summary["final_version"] == 30 and summary["max_trained_staleness"] <= 1
    assert summary["groups_trained"] == 30 * 4
    stats = cluster.actor_stats()
    assert sorted(stats) == [0, 1] and all(s["duplicates"] == 0 for s in stats.values()), stats
    out = relaunched.output()
    assert "actor ids [0, 1] of 2" in out, out[-3000:]  # its own ids back, at once
    assert "waiting for 2 free actor id" not in out, out[-3000:]
    assert cursors_before  # the meta survived the kill (Redis lives on another host)


@pytest.mark.timeout(600)
def test_partitioned_actor_host_is_reported_and_the_job_carries_on_after_the_heal(cluster):
    """The actors' link goes down twice, mid-run: first for longer than the lease TTL, then
    for longer than the weight-sync deadline. Each partition starts while the learner holds a
    batch it has just read (a failpoint traces the read and sleeps 3 s), so the sync after that
    step meets the partition: which is what the test is about, not a race between the actors'
    speed and the learner's. Every role reports it, nothing waits past its deadline, and
    after each heal the job carries on; conservation and the staleness bound hold. Redis
    serves TLS only here (``buffer.tls_dir``: a certificate made for the redis host's address),
    so the roles also reconnect over TLS after each heal."""
    roles, hosts = cluster.roles, cluster.hosts
    ttl, sync_s = 4, 8
    reads = cluster.tmp / "reads.jsonl"  # one line per batch read, on each learner node
    partitions = {15: ttl + 3, 30: sync_s + 6}  # the read (1, 2, ...) that starts each one
    hold = ",".join(f"learner.after_read=sleep:3@{n}" for n in partitions)
    failpoints = {"ASYNCRL_FAILPOINTS": f"learner.after_read=trace:{reads}@0,{hold}"}
    cluster.start_buffer(f"buffer.tls_dir={cluster.tmp / 'tls'}")
    assert cluster.url_file("actor").read_text().startswith("rediss://actor:")
    learners = cluster.start_learner("learner.steps=45", f"learner.weight_sync_timeout_s={sync_s}",
                                     f"buffer.lease_ttl_s={ttl}", "buffer.max_staleness=2",
                                     env=failpoints)  # fmt: skip
    actors = cluster.start_actors("actor.sim_tokens_per_s=300", f"buffer.lease_ttl_s={ttl}",
                                  "buffer.max_staleness=2",
                                  f"learner.weight_sync_timeout_s={sync_s}")  # fmt: skip
    for hit, seconds in partitions.items():
        roles.wait_until(lambda hit=hit: _read_traced(reads, hit), 300, f"the learner's read {hit}")
        with hosts.partitioned("actors"):  # the learner sleeps 3 s, trains, then syncs
            time.sleep(seconds)
        _next_step(roles, learners[0])  # the job carries on after the heal
    cluster.wait_job(learners, actors, 400)
    summary = cluster.summary()
    check_conservation(summary)
    assert summary["final_version"] == 45 and summary["max_trained_staleness"] <= 2
    assert summary["weight_sync"]["failures"] >= 1, summary["weight_sync"]  # reported, retried
    learner_log, actor_log = learners[0].output(), actors.output()
    assert "weight sync" in learner_log and "failed" in learner_log, learner_log[-3000:]
    # the actors' host reports it too. Which of its Redis clients notices depends on timing:
    # a call in flight when the link drops simply waits (the socket timeout is 30 s), a new
    # connection fails at once (No route to host). The launcher renews the actor ids every
    # few seconds, so at least its renewal meets the partition. A client that lost its
    # connection reconnects over TLS after the heal, and the job finishing proves the rest.
    lost = "lost connection to Redis" in actor_log
    assert lost or "cannot renew actor ids" in actor_log, actor_log[-3000:]
    assert not lost or "reconnected to Redis" in actor_log, actor_log[-3000:]
    print(
        "\n--- learner ---\n"
        + "\n".join(ln for ln in learner_log.splitlines() if not ln.startswith("step"))[-3000:]
    )
    print("--- actors ---\n" + actor_log[-3000:])


@pytest.mark.timeout(300)
def test_default_config_on_a_host_with_a_network_address_listens_on_loopback_only(
    hosts_factory, roles, tmp_path
):
    """``asyncrl run`` with the defaults on a host that has a routable address: every TCP
    listener and bound UDP socket of the job is on loopback."""
    hosts = hosts_factory(["solo"])
    cluster = Cluster(hosts, roles, tmp_path)
    args = ["run", "experiment=tiny", "actor.engine=sim", "learner.steps=100000",
            "actor.sim_tokens_per_s=300", f"run_dir={tmp_path / 'run'}"]  # fmt: skip
    proc = roles.start("solo", hosts.cmd("solo", [*CLI, *args]))
    roles.wait_line(proc, "step    3 ", 240)
    found = cluster.listeners("solo")
    udp = hosts.run("solo", ["ss", "-lunpH"]).stdout.split("\n")
    assert any(p == "redis-server" for _, _, p in found), found  # not vacuous
    assert len(found) >= 6, found  # redis, control, torchrun store, metrics x3, ...
    stray = [s for s in found if s[0] != "127.0.0.1"]
    assert not stray, f"listening beyond loopback: {stray}"
    assert not [ln for ln in udp if ln.strip() and "127.0.0.1" not in ln], udp
    assert hosts.addr("solo") not in "\n".join(map(str, found))
