"""Metrics: each role's real HTTP endpoint exports the names docs/metrics.md documents.

In-process (no model, no vLLM): the learner's set reads a real redis-server buffer.
``test_metrics_run.py`` scrapes the endpoints of a real ``asyncrl run``.
"""

from __future__ import annotations

import random
import re
import socket
from pathlib import Path

import pytest

from asyncrl.metrics import (
    ACTOR_STATES,
    LEARNER_STATES,
    ActorMetrics,
    LauncherMetrics,
    LearnerMetrics,
    StateClock,
    register_endpoint,
    role_port,
    serve,
)
from asyncrl.orchestration.status import scrape

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


def missing_names(samples: dict, process: str) -> list[str]:
    names = {n for n, _ in samples}
    want = [exported_name(n, k) for n, k in documented()[process]]
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_doc_table_names_follow_prometheus_conventions():
    docs = documented()
    assert {"launcher", "learner", "actor"} <= set(docs)
    for name, kind in (x for rows in docs.values() for x in rows):
        assert name.startswith("asyncrl_")
        assert name.endswith("_total") == (kind == "counter"), name
        assert not re.search(r"_(ms|millis|percent|count)$", name), name


def test_learner_endpoint_exports_documented_names(redis_client, buffer_name):
    from buffer.redis_buffer import ReplayBuffer
    from buffer.testing import random_group

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
    a = scrape(f"127.0.0.1:{serve(actor.registry, free_port())}")
    assert missing_names(a, "actor") == []
    assert undocumented(a, "actor") == []
    assert a[("asyncrl_actor_tokens_generated_total", ())] == 17
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
    register_endpoint(redis_client, buffer_name, "actor3", "127.0.0.1", 9495)
    register_endpoint(redis_client, buffer_name, "actor4", "127.0.0.1", 0)  # off: not listed
    assert redis_client.hgetall(f"{buffer_name}:endpoints") == {b"actor3": b"127.0.0.1:9495"}


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
