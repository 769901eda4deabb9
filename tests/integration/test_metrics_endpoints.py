"""Metrics: each role's real HTTP endpoint exports the names docs/metrics.md documents, and
``asyncrl status`` scrapes the endpoints of its own host only.

In-process (no model, no vLLM): the learner's set reads a real redis-server buffer.
``test_metrics_run.py`` scrapes the endpoints of a real ``asyncrl run``.
"""

from __future__ import annotations

import os
import random
import re
import socket
from pathlib import Path

import pytest

from asyncrl.core.config.network import NetworkConfig
from asyncrl.core.net.endpoints import Endpoint, Place, read_endpoints, register_endpoint
from asyncrl.core.observe.metrics import (
    ACTOR_STATES,
    LEARNER_STATES,
    ActorMetrics,
    LauncherMetrics,
    LearnerMetrics,
    StateClock,
    role_port,
    serve,
)
from asyncrl.core.observe.tallies import AGENT_TALLY, EPISODE_TALLY
from asyncrl.core.runtime.torchrun import free_port
from asyncrl.orchestration.status import render_status, scrape

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
_ROW = re.compile(r"^\| `(asyncrl_[a-z0-9_]+)` \| (\w+) \| (\w+) \|")


def documented() -> dict[str, list[tuple[str, str]]]:
    """process -> [(name, type)] from the table in docs/metrics.md."""
    out: dict[str, list[tuple[str, str]]] = {}
    for line in DOC.read_text().splitlines():
        m = _ROW.match(line)
        if m:
            name, kind, process = m.groups()
            for p in ("launcher", "learner", "actor") if process == "all" else (process,):
                out.setdefault(p, []).append((name, kind))
    return out


def exported_name(name: str, kind: str) -> str:
    """The sample name a scrape shows for a documented family."""
    return {"histogram": f"{name}_count", "info": f"{name}"}.get(kind, name)


TALLIED = {
    f"{name}_total"
    for tally in (EPISODE_TALLY, AGENT_TALLY)
    for name, *_ in (*tally.counters.values(), *tally.labeled.values())
}
"""The actor's episode and agent counters: exported only by a run with episodes or an agent."""


def missing_names(
    samples: dict, process: str, skip: set[str] | frozenset = frozenset()
) -> list[str]:
    """Documented names of ``process`` the scrape lacks (``skip``: those not required)."""
    names = {n for n, _ in samples}
    want = [exported_name(n, k) for n, k in documented()[process] if n not in skip]
    return [n for n in want if n not in names]


def undocumented(samples: dict, process: str) -> list[str]:
    """Families a scrape shows that docs/metrics.md does not list for ``process``, or whose
    name lacks the process part (``asyncrl_<process>_``; the buffer gauges and the process
    info are shared by every process)."""
    docs = {n for n, _ in documented()[process]}
    bad = set()
    for name, _ in samples:
        if name.startswith("process_"):  # prometheus_client's standard process collector
            continue
        for suffix in ("_bucket", "_count", "_sum", "_created"):
            if name.endswith(suffix) and name[: -len(suffix)] in docs | {
                d.removesuffix("_total") for d in docs
            }:
                name = name[: -len(suffix)]
                break
        known = name in docs or f"{name}_total" in docs
        prefixed = name.startswith((f"asyncrl_{process}_", "asyncrl_buffer_", "asyncrl_process"))
        if not (known and prefixed):
            bad.add(name)
    return sorted(bad)


def test_doc_table_names_follow_prometheus_conventions():
    docs = documented()
    assert {"launcher", "learner", "actor"} <= set(docs)
    for name, kind in (x for rows in docs.values() for x in rows):
        assert name.startswith("asyncrl_")
        assert name.endswith("_total") == (kind == "counter"), name
        assert not re.search(r"_(ms|millis|percent|count)$", name), name


def test_learner_endpoint_exports_documented_names(redis_client, buffer_name):
    from asyncrl.buffer.redis_buffer import ReplayBuffer
    from asyncrl.buffer.testing import random_group

    buf = ReplayBuffer(redis_client, buffer_name, capacity=8)
    clock = StateClock(LEARNER_STATES, "starting")
    m = LearnerMetrics({"buffer_name": buffer_name, "mode": "async"}, clock, buf)
    port = serve(m.registry, free_port())
    rng = random.Random(0)
    groups = [random_group(rng, versions=(3, 4)) for _ in range(3)]
    step_metrics = {
        "is_weight_mean": 1.01, "is_weight_max": 1.9, "is_weight_p99": 1.5, "is_ess": 0.97,
        "is_truncated_frac": 0.0, "is_masked_frac": 0.0, "approx_kl_behave": 0.01,
        "entropy": 2.0, "loss": 0.1, "grad_norm": 0.5, "lr": 5e-4, "clip_frac_low": 0.1,
        "clip_frac_high": 0.2, "clip_frac_dual": 0.0, "pg_loss": 0.1,
    }  # fmt: skip
    clock.set("waiting_data")
    clock.set("busy")
    m.observe_step(5, groups, [1, 2, 1], 0.25, 0.4, step_metrics)
    m.dropped.labels("stale").inc(2)
    m.sync_seconds.observe(0.05)
    m.sync_bytes.inc(1000)
    s = scrape(f"127.0.0.1:{port}")
    assert s is not None
    assert missing_names(s, "learner") == []
    assert undocumented(s, "learner") == []
    assert s[("asyncrl_learner_version", ())] == 5
    assert s[("asyncrl_learner_groups_trained_total", ())] == 3
    assert s[("asyncrl_learner_tokens_trained_total", ())] == sum(g.num_tokens for g in groups)
    assert s[("asyncrl_learner_trained_staleness_versions_bucket", (("le", "1.0"),))] == 2
    assert s[("asyncrl_learner_groups_dropped_total", (("reason", "stale"),))] == 2
    assert s[("asyncrl_learner_clip_ratio", (("side", "high"),))] == 0.2
    assert s[("asyncrl_learner_step_metric", (("name", "pg_loss"),))] == 0.1
    assert s[("asyncrl_buffer_capacity_slots", ())] == 8
    assert s[("asyncrl_buffer_up", ())] == 1
    states = {dict(lb)["state"] for n, lb in s if n == "asyncrl_learner_time_seconds_total"}
    assert states == set(LEARNER_STATES)


def test_actor_and_launcher_endpoints_export_documented_names():
    clock = StateClock(ACTOR_STATES, "starting")
    actor = ActorMetrics({"buffer_name": "j", "actor_id": 3}, clock)
    actor.tokens.inc(17)
    actor.sync_seconds.observe(0.1)
    actor.group_seconds.observe(0.2)
    episodes = {"episodes": 3, "ends": {"done": 2, "env_error": 1}, "turns": 5, "tool_calls": 2,
                "tool_errors": 1, "env_failures": ["env_error: boom"], "parts": 4,
                "parts_dropped": 1}  # fmt: skip
    agents = {"episodes": 4, "ends": {"done": 4}, "calls": {"first": 4, "extend": 3},
              "refused": {"bad_key": 1}, "overridden": {"temperature": 2}, "streamed": 1,
              "reasons": ["..."]}  # fmt: skip
    actor.watch(EPISODE_TALLY, lambda: episodes)
    actor.watch(AGENT_TALLY, lambda: agents)
    a = scrape(f"127.0.0.1:{serve(actor.registry, free_port())}")
    assert missing_names(a, "actor") == []
    assert undocumented(a, "actor") == []
    assert a[("asyncrl_actor_tokens_generated_total", ())] == 17
    assert a[("asyncrl_actor_episodes_total", ())] == 3
    assert a[("asyncrl_actor_episode_ends_total", (("end", "env_error"),))] == 1
    assert a[("asyncrl_actor_episode_parts_dropped_total", ())] == 1
    assert a[("asyncrl_actor_episode_ends_total", (("end", "max_turns"),))] == 0  # always shown
    assert a[("asyncrl_actor_agent_calls_total", (("kind", "extend"),))] == 3
    assert a[("asyncrl_actor_agent_calls_total", (("kind", "new"),))] == 0
    assert a[("asyncrl_actor_agent_refused_total", (("reason", "bad_key"),))] == 1
    assert a[("asyncrl_actor_agent_overridden_total", (("param", "temperature"),))] == 2
    assert a[("asyncrl_actor_agent_retries_total", ())] == 0  # absent from the dict: 0
    episodes["ends"]["done"] += 1  # read at each scrape
    a = scrape(f"127.0.0.1:{serve(actor.registry, free_port())}")
    assert a[("asyncrl_actor_episode_ends_total", (("end", "done"),))] == 3
    info = [lb for n, lb in a if n == "asyncrl_process_info"][0]
    assert dict(info)["role"] == "actor" and dict(info)["actor_id"] == "3"

    class _Proc:
        def __init__(self, code):
            self.code = code

        def poll(self):
            return self.code

    class _Role:
        def __init__(self, name, code):
            self.name, self.proc = name, _Proc(code)

    class _Redis:
        restarts = 2

    roles = [_Role("learner", None), _Role("actor0", 0)]
    launcher = LauncherMetrics({"buffer_name": "j"}, lambda: roles, _Redis())
    s = scrape(f"127.0.0.1:{serve(launcher.registry, free_port())}")
    assert missing_names(s, "launcher") == []
    assert s[("asyncrl_launcher_redis_restarts_total", ())] == 2
    assert undocumented(s, "launcher") == []
    assert s[("asyncrl_launcher_role_up", (("role", "learner"),))] == 1
    assert s[("asyncrl_launcher_role_up", (("role", "actor0"),))] == 0


def test_endpoints_bind_loopback_only_and_fall_back_when_the_port_is_taken():
    from prometheus_client import CollectorRegistry

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        port = serve(CollectorRegistry(), busy)
        assert port and port != busy
    assert scrape(f"127.0.0.1:{port}") is not None
    addrs = [a for a in _lan_addresses() if not a.startswith("127.")]
    for addr in addrs[:1]:  # nothing listens on a non-loopback address
        with pytest.raises(OSError), socket.create_connection((addr, port), timeout=1):
            pass
    assert serve(CollectorRegistry(), 0) == 0  # 0 = off


def _lan_addresses() -> list[str]:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent; picks the outgoing address
            return [s.getsockname()[0]]
    except OSError:
        return []


def test_role_ports_and_endpoint_registry(redis_client, buffer_name):
    assert [role_port(9490, r) for r in ("launcher", "learner")] == [9490, 9491]
    assert role_port(9490, "actor", 3) == 9495
    assert role_port(0, "actor", 3) == 0
    network = NetworkConfig(bind="0.0.0.0", advertise="10.0.0.7")
    register_endpoint(redis_client, buffer_name, "actor3", 9495, network, gpus="2,3")
    register_endpoint(redis_client, buffer_name, "actor4", 0, network)  # off: not listed
    here = Place.here("10.0.0.7")
    assert read_endpoints(redis_client, buffer_name) == {
        "actor3": Endpoint("actor3", "127.0.0.1:9495", here, os.getpid(), "2,3")
    }


class _CountingCollector:
    """A collector that counts the scrapes of the endpoint serving it."""

    def __init__(self) -> None:
        self.scrapes = 0

    def collect(self):
        self.scrapes += 1
        return []


def _served_actor(buffer_name: str, actor_id: int) -> int:
    """The port of an actor's ``/metrics``, served by this process."""
    clock = StateClock(ACTOR_STATES, "idle")
    metrics = ActorMetrics({"buffer_name": buffer_name, "actor_id": actor_id}, clock)
    return serve(metrics.registry, free_port())


def test_status_scrapes_this_hosts_endpoints_and_names_the_host_of_the_others(
    redis_server, redis_client, buffer_name
):
    """One host of a multi-host job: its own endpoints are scraped; an actor and a launcher
    registered on another host are listed with that host (and the actor's live leases, from
    Redis), and not scraped, although a process here listens on the port they registered
    (which is what scraping 127.0.0.1 here used to reach); an older version's plain
    ``host:port`` is still scraped."""
    from prometheus_client import CollectorRegistry

    from asyncrl.buffer.redis_buffer import ReplayBuffer
    from asyncrl.core.config.load import load_config

    buf = ReplayBuffer(redis_client, buffer_name, capacity=4)
    assert buf.lease(7, timeout_s=1.0) and buf.lease(7, timeout_s=1.0)
    port = _served_actor(buffer_name, 0)
    register_endpoint(redis_client, buffer_name, "actor0", port, NetworkConfig())
    older = f"127.0.0.1:{_served_actor(buffer_name, 1)}"
    bystander, registry = _CountingCollector(), CollectorRegistry()
    registry.register(bystander)
    trap = f"127.0.0.1:{serve(registry, free_port())}"
    node_b = Place("nodeB", "10.0.0.7", "another-boot/4026531840")
    launcher = "launcher-actors@10.0.0.7"
    written = [
        Endpoint("actor1", older, None),
        Endpoint("actor7", trap, node_b, 4242, "2,3"),  # its CUDA_VISIBLE_DEVICES
        Endpoint(launcher, trap, node_b, 4241),
    ]
    redis_client.hset(f"{buffer_name}:endpoints", mapping={e.role: e.to_json() for e in written})
    before = bystander.scrapes
    cfg = load_config([f"buffer.url={redis_server.url}", f"buffer.name={buffer_name}"])
    text = render_status(cfg, window_s=0.2)
    assert bystander.scrapes == before
    lines = {line.split()[0]: line for line in text.splitlines()[2:] if not line.startswith(" ")}
    assert list(lines) == [launcher, "actor0", "actor1", "actor7"], text
    assert lines[launcher] == (
        f"{launcher} on nodeB (10.0.0.7), pid 4241: run `asyncrl status` on that host for its rates"
    )
    assert lines["actor7"] == (
        "actor7    on nodeB (10.0.0.7), pid 4242: 2 group(s) leased now; run `asyncrl status` "
        "on that host for its rates; on GPUs 2,3"
    )
    assert lines["actor0"].startswith(f"actor0    [127.0.0.1:{port}] weights v0  generated")
    assert lines["actor1"].startswith(f"actor1    [{older}] weights v0  generated")


def test_status_of_a_host_with_none_of_the_endpoints_does_not_wait(
    redis_server, redis_client, buffer_name
):
    import time

    from asyncrl.core.config.load import load_config

    learner = Endpoint("learner", "127.0.0.1:9491", Place("nodeA", "10.0.0.5", "b/1"), 99)
    netns = Place(socket.gethostname(), "10.0.0.6", "b/2")  # a tests/multihost "host"
    actor = Endpoint("actor0", "127.0.0.1:9492", netns, 98)
    fields = {e.role: e.to_json() for e in (learner, actor)}
    redis_client.hset(f"{buffer_name}:endpoints", mapping=fields)
    cfg = load_config([f"buffer.url={redis_server.url}", f"buffer.name={buffer_name}"])
    start = time.monotonic()
    out = render_status(cfg, window_s=30.0)
    assert time.monotonic() - start < 10.0
    assert "learner   on nodeA (10.0.0.5), pid 99: run `asyncrl status` on that host" in out
    assert f"actor0    on {netns.host} (10.0.0.6) in another network namespace, pid 98" in out


def test_state_clock_partitions_time():
    t = [0.0]
    clock = StateClock(("a", "b", "c"), "a", now=lambda: t[0])
    t[0] = 1.0
    clock.set("b")
    t[0] = 3.5
    clock.set("a")
    t[0] = 4.0
    assert clock.totals() == {"a": 1.5, "b": 2.5, "c": 0.0}
    assert sum(clock.totals().values()) == 4.0
    with pytest.raises(ValueError, match="unknown state"):
        clock.set("d")
    with pytest.raises(ValueError):
        StateClock(("a",), "z")
