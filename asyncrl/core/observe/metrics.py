"""Prometheus metrics: every process serves ``/metrics`` on loopback (``network.metrics``).

    process          port (metrics_port = P; 0 turns every endpoint off)
    launcher         P          the ``asyncrl run`` / ``asyncrl launch`` process
    learner rank 0   P + 1      steps, throughput, staleness, drops, weight sync, IS diagnostics,
                                buffer depth (read from Redis at scrape time)
    actor i          P + 2 + i  generation throughput, busy/idle/paused time, weight version

A port already in use falls back to a free one (with a warning). Every process records where
it actually serves, and on which host, in the buffer's hash ``<buffer.name>:endpoints``
(``asyncrl/core/net/endpoints.py``), which ``asyncrl status`` reads. Each process uses its own
``CollectorRegistry`` (vLLM keeps its own metrics in the default one). The full list of names
is in docs/metrics.md and ``tests/integration/test_metrics_endpoints.py`` scrapes real
endpoints against it.

Conventions: ``asyncrl_<role>_<what>_<unit>``; counters end in ``_total``; time in seconds;
fractions are ``_ratio``; throughput is a counter (``rate(..._tokens_generated_total[1m])``).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from asyncrl.core.observe.tallies import Tally, TallyCollector

disable_created_metrics()  # no *_created series: they double every counter's output

DEFAULT_HOST = "127.0.0.1"
LAUNCHER_OFFSET, LEARNER_OFFSET, ACTOR_OFFSET = 0, 1, 2
STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 16, float("inf"))
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, float("inf"))
LEARNER_STATES = ("starting", "busy", "waiting_data", "weight_sync", "checkpoint")
ACTOR_STATES = (
    "starting", "generating", "waiting_env", "paused", "waiting_weights", "waiting_buffer", "idle"
)  # fmt: skip


def role_port(base: int, role: str, actor_id: int = 0) -> int:
    """The configured port of ``role`` ("launcher" | "learner" | "actor"); 0 when off."""
    if not base:
        return 0
    offset = {"launcher": LAUNCHER_OFFSET, "learner": LEARNER_OFFSET}.get(role)
    return base + (ACTOR_OFFSET + actor_id if offset is None else offset)


def serve(registry: CollectorRegistry, port: int, host: str = DEFAULT_HOST) -> int:
    """Serve ``registry`` on ``host:port`` in a daemon thread; returns the bound port (0: off).

    A port in use falls back to a free one, so two jobs on one machine never fail on it.
    """
    if not port:
        return 0
    try:
        server, _ = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        server, _ = start_http_server(0, addr=host, registry=registry)
        print(
            f"[metrics] port {port} unavailable ({e.strerror}); serving on "
            f"{host}:{server.server_port} instead",
            file=sys.stderr,
            flush=True,
        )
    return server.server_port


class StateClock:
    """Seconds spent in each of a fixed set of states; exactly one state holds at a time.

    Invariant: ``sum(totals().values())`` equals the time since construction. Thread-safe
    (the scrape thread reads while the role's loop switches states).
    """

    def __init__(self, states: Iterable[str], initial: str, now: Callable[[], float] | None = None):
        self.states = tuple(states)
        if initial not in self.states:
            raise ValueError(f"initial state {initial!r} not in {self.states}")
        self._now = now or time.monotonic
        self._lock = threading.Lock()
        self._totals = dict.fromkeys(self.states, 0.0)
        self._state, self._since = initial, self._now()

    @property
    def state(self) -> str:
        return self._state

    def set(self, state: str) -> None:
        if state not in self._totals:
            raise ValueError(f"unknown state {state!r}; states are {self.states}")
        with self._lock:
            now = self._now()
            self._totals[self._state] += now - self._since
            self._state, self._since = state, now

    def totals(self) -> dict[str, float]:
        """Seconds per state, including the time spent so far in the current state."""
        with self._lock:
            out = dict(self._totals)
            out[self._state] += self._now() - self._since
        return out


class _ClockCollector:
    """Exports a StateClock as one counter with a ``state`` label."""

    def __init__(self, name: str, doc: str, clock: StateClock) -> None:
        self.name, self.doc, self.clock = name, doc, clock

    def collect(self):
        fam = CounterMetricFamily(self.name, self.doc, labels=["state"])
        for state, seconds in self.clock.totals().items():
            fam.add_metric([state], seconds)
        yield fam


class BufferStats(Protocol):
    """What the metrics read of the buffer (``asyncrl.buffer.faces.LearnerBuffer`` has it;
    core cannot import the buffer's layer)."""

    def stats(self) -> dict[str, int]: ...


class _BufferCollector:
    """Buffer depth and counters, read from Redis at scrape time (one atomic snapshot)."""

    _GAUGES = {
        "unread": ("asyncrl_buffer_unread_groups", "Committed groups not yet read (depth)."),
        "pending": ("asyncrl_buffer_pending_groups", "Read by the learner, not yet acked."),
        "leased": ("asyncrl_buffer_leased_slots", "Slots leased by actors (generating)."),
        "capacity": ("asyncrl_buffer_capacity_slots", "Admission limit: leased + unread."),
    }

    def __init__(self, buffer: BufferStats) -> None:
        self.buffer = buffer

    def collect(self):
        up = GaugeMetricFamily("asyncrl_buffer_up", "1 if the buffer answered this scrape.")
        try:
            stats = self.buffer.stats()
        except Exception:  # a scrape must not fail because Redis is briefly away
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        for key, (name, doc) in self._GAUGES.items():
            yield GaugeMetricFamily(name, doc, value=stats[key])
        yield CounterMetricFamily(
            "asyncrl_buffer_groups_committed",
            "Groups committed by all actors (job-wide).",
            value=stats["committed"],
        )


def _c(registry, name: str, doc: str, labels=()) -> Counter:
    return Counter(name, doc, labels, registry=registry)


def _g(registry, name: str, doc: str, labels=()) -> Gauge:
    return Gauge(name, doc, labels, registry=registry)


def _h(registry, name: str, doc: str, buckets=SECONDS_BUCKETS) -> Histogram:
    return Histogram(name, doc, buckets=buckets, registry=registry)


def _registry(role: str, info: dict[str, str]) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=reg)  # process_cpu_seconds_total, process_resident_memory_bytes
    Info("asyncrl_process", "Role of this process and the job it belongs to.", registry=reg).info(
        {"role": role, **{k: str(v) for k, v in info.items()}}
    )
    return reg


# Step metrics (learner/algo/losses.py names) -> Prometheus gauge names. Anything else the loss
# reports goes to asyncrl_learner_step_metric{name=...}.
_STEP_GAUGES = {
    "is_weight_mean": "asyncrl_learner_is_weight_mean",
    "is_weight_max": "asyncrl_learner_is_weight_max",
    "is_weight_p99": "asyncrl_learner_is_weight_p99",
    "is_ess": "asyncrl_learner_is_ess_ratio",
    "is_truncated_frac": "asyncrl_learner_is_truncated_ratio",
    "is_masked_frac": "asyncrl_learner_is_masked_ratio",
    "approx_kl_behave": "asyncrl_learner_approx_kl_behave",
    "entropy": "asyncrl_learner_entropy_nats",
    "loss": "asyncrl_learner_loss",
    "grad_norm": "asyncrl_learner_grad_norm",
    "lr": "asyncrl_learner_learning_rate",
    "response/clip_ratio": "asyncrl_learner_response_clip_ratio",
}
_CLIP_SIDES = ("low", "high", "dual")


class LearnerMetrics:
    """Learner rank 0. ``clock`` is the learner's busy/waiting/sync/checkpoint StateClock."""

    def __init__(self, info: dict, clock: StateClock, buffer: BufferStats | None = None) -> None:
        r = self.registry = _registry("learner", info)
        self.version = _g(r, "asyncrl_learner_version", "Policy version (optimizer steps).")
        self.steps = _c(r, "asyncrl_learner_steps", "Optimizer steps taken by this process.")
        self.groups = _c(r, "asyncrl_learner_groups_trained", "Groups trained.")
        self.samples = _c(r, "asyncrl_learner_samples_trained", "Completions trained.")
        self.tokens = _c(r, "asyncrl_learner_tokens_trained", "Completion tokens trained.")
        self.reward = _g(r, "asyncrl_learner_reward", "Mean reward of the last batch.")
        self.staleness = _h(
            r,
            "asyncrl_learner_trained_staleness_versions",
            "V - version_min of every trained group.",
            STALENESS_BUCKETS,
        )
        self.dropped = _c(r, "asyncrl_learner_groups_dropped", "Groups not trained.", ["reason"])
        self.step_seconds = _h(r, "asyncrl_learner_step_seconds", "Wall time of one step.")
        self.sync_seconds = _h(
            r, "asyncrl_learner_weight_sync_seconds", "Learner side of one sync."
        )
        self.sync_bytes = _c(r, "asyncrl_learner_weight_sync_bytes", "Weight bytes broadcast.")
        self.sync_failures = _c(
            r, "asyncrl_learner_weight_sync_failures", "Sync attempts that failed and were retried."
        )
        self.sync_regroups = _c(
            r,
            "asyncrl_learner_weight_sync_regroups",
            "Weight groups formed after the first (an actor died, restarted or joined).",
        )
        self.step_gauges = {
            k: _g(r, name, f"Last step's {k} (see docs/algorithms.md).")
            for k, name in _STEP_GAUGES.items()
        }
        self.clip = _g(r, "asyncrl_learner_clip_ratio", "Clipped token fraction.", ["side"])
        self.other = _g(r, "asyncrl_learner_step_metric", "Other step metrics.", ["name"])
        for reason in ("stale", "invalid", "poison", "uniform"):
            self.dropped.labels(reason)
        r.register(_ClockCollector("asyncrl_learner_time_seconds", "Time by state.", clock))
        if buffer is not None:
            r.register(_BufferCollector(buffer))

    def observe_step(
        self,
        version: int,
        groups,
        staleness: list[int],
        reward: float,
        step_s: float,
        metrics: dict[str, float],
    ) -> None:
        self.version.set(version)
        self.steps.inc()
        self.groups.inc(len(groups))
        self.samples.inc(sum(len(g.samples) for g in groups))
        self.tokens.inc(sum(g.num_tokens for g in groups))
        self.reward.set(reward)
        self.step_seconds.observe(step_s)
        for s in staleness:
            self.staleness.observe(s)
        for key, value in metrics.items():
            if key in self.step_gauges:
                self.step_gauges[key].set(value)
            elif key.startswith("clip_frac_") and key[10:] in _CLIP_SIDES:
                self.clip.labels(key[10:]).set(value)
            else:
                self.other.labels(key).set(value)


class ActorMetrics:
    """One actor process. ``clock`` tracks generating/paused/waiting time."""

    def __init__(self, info: dict, clock: StateClock) -> None:
        r = self.registry = _registry("actor", info)
        self.version = _g(r, "asyncrl_actor_weight_version", "Weight version the engine holds.")
        self.groups = _c(r, "asyncrl_actor_groups_generated", "Groups generated.")
        self.samples = _c(r, "asyncrl_actor_samples_generated", "Completions generated.")
        self.tokens = _c(r, "asyncrl_actor_tokens_generated", "Completion tokens generated.")
        self.committed = _c(r, "asyncrl_actor_groups_committed", "Groups stored in the buffer.")
        self.duplicates = _c(
            r, "asyncrl_actor_groups_duplicate", "Commits of an already stored group_id."
        )
        self.reward_errors = _c(r, "asyncrl_actor_reward_errors", "Reward function failures.")
        self.inflight = _g(r, "asyncrl_actor_inflight_groups", "Groups generating now.")
        self.group_seconds = _h(r, "asyncrl_actor_group_seconds", "Generate+reward, one group.")
        self.sync_seconds = _h(r, "asyncrl_actor_weight_sync_seconds", "Paused for one update.")
        r.register(_ClockCollector("asyncrl_actor_time_seconds", "Time by state.", clock))

    def watch(self, tally: Tally, read: Callable[[], dict]) -> None:
        """Export ``read()`` (the actor's episode or agent counts) as ``tally``'s counters,
        read at every scrape (tallies.py)."""
        self.registry.register(TallyCollector(tally, read))


class LauncherMetrics:
    """The launching process: which roles are up, how often each was restarted."""

    def __init__(self, info: dict, roles: Callable[[], list], server=None) -> None:
        """``server``: the private ``asyncrl.buffer.service.server.RedisServer`` this launcher watches (its
        ``restarts``), or None when the job uses an external ``buffer.url``."""
        self.registry = _registry("launcher", info)
        self.registry.register(_RolesCollector(roles, server))


class _RolesCollector:
    def __init__(self, roles: Callable[[], list], server=None) -> None:
        self.roles, self.server = roles, server

    def collect(self):
        fam = GaugeMetricFamily(
            "asyncrl_launcher_role_up", "1 while the role's process runs.", labels=["role"]
        )
        restarts = CounterMetricFamily(
            "asyncrl_launcher_role_restarts",
            "Times the launcher restarted the role after it died (actor.restart_max).",
            labels=["role"],
        )
        for role in self.roles():
            fam.add_metric([role.name], 1 if role.proc.poll() is None else 0)
            restarts.add_metric([role.name], getattr(role, "restarts", 0))
        yield fam
        yield restarts
        if self.server is not None:
            redis_restarts = CounterMetricFamily(
                "asyncrl_launcher_redis_restarts",
                "Times the launcher restarted its private redis-server from its AOF.",
            )
            redis_restarts.add_metric([], self.server.restarts)
            yield redis_restarts
