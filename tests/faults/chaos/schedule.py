"""A chaos run's fault schedule, drawn from a seed: pure (no processes, no clock), so a failing
seed replays the same schedule (``ASYNCRL_CHAOS_SEED=<seed>``).

A schedule is a list of ``Fault(t_s, kind, target, duration_s)`` sorted by ``t_s`` (seconds
after the chaos starts)::

    kill       SIGKILL the target process (an actor, a learner rank, redis-server); the
               launcher restarts it (``actor.restart_max``, ``learner.restart_max``, Redis
               always). duration 0.
    stop       SIGSTOP the target, SIGCONT it ``duration_s`` later.
    partition  cut a host (a network namespace) off the others for ``duration_s``.
    disk_full  fill the file system of ``learner.checkpoint_dir`` for ``duration_s``.

Faults come in bursts (1 to 3 targets within ``burst_s`` of each other, on different
targets), so several are under way at once; one target never has two faults at once (a
SIGCONT would end the other's stop early). Kills of a target are at most ``max_kills`` and at
least ``kill_gap_s`` apart (a role must come back and make progress between two), and a kill
is drawn only as often as ``kill_p`` says; otherwise the fault is a stop. A disk fill, when
drawn (``disk_p``), starts in the last third: a full checkpoint disk ends the job by design
(docs/reliability.md: a full disk is an error a restart cannot fix), and the faults before it
should run first.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

KILL, STOP, PARTITION, DISK_FULL = "kill", "stop", "partition", "disk_full"
KINDS = (KILL, STOP, PARTITION, DISK_FULL)
DISK = "disk"
"""The target of a ``disk_full`` fault."""


@dataclass(frozen=True)
class Fault:
    t_s: float
    """When it starts, seconds after the chaos starts."""
    kind: str
    target: str
    """A process (``actor0``, ``learner``, ``redis``), a host (a partition) or ``disk``."""
    duration_s: float = 0.0

    @property
    def end_s(self) -> float:
        return self.t_s + self.duration_s

    def describe(self) -> str:
        span = f" for {self.duration_s:.1f}s" if self.duration_s else ""
        return f"t={self.t_s:6.1f}s {self.kind} {self.target}{span}"


@dataclass(frozen=True)
class Plan:
    """What a schedule may hold."""

    duration_s: float
    """Faults start within [0, duration_s); every one has ended by ``duration_s`` + its
    ``max_*_s``."""
    processes: tuple[str, ...] = ("actor0", "actor1", "learner", "redis")
    hosts: tuple[str, ...] = ()
    """Hosts that may be partitioned (none: a single-host job)."""
    disk_p: float = 0.0
    """The chance that the schedule fills the checkpoint disk once."""
    mean_gap_s: float = 8.0
    """Mean time between two bursts (exponential)."""
    burst_s: float = 2.0
    kill_p: float = 0.4
    max_kills: dict[str, int] = field(default_factory=lambda: {"learner": 3})
    """Kills per target at most (a target not named: ``default_max_kills``)."""
    default_max_kills: int = 4
    kill_gap_s: dict[str, float] = field(default_factory=lambda: {"learner": 25.0, "redis": 6.0})
    default_kill_gap_s: float = 8.0
    max_stop_s: float = 10.0
    max_partition_s: float = 12.0
    disk_s: tuple[float, float] = (3.0, 8.0)

    def __post_init__(self) -> None:
        if self.duration_s <= 0 or self.mean_gap_s <= 0 or not (self.processes or self.hosts):
            raise ValueError(f"a plan needs a duration, a gap and targets: {self}")


def draw(seed: int, plan: Plan) -> list[Fault]:
    """The schedule of ``seed`` under ``plan`` (module docstring); the same seed and plan give
    the same list."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    busy_until: dict[str, float] = {}
    kills: dict[str, int] = {}
    last_kill: dict[str, float] = {}
    targets = list(plan.processes) + list(plan.hosts)
    t = rng.uniform(1.0, plan.mean_gap_s)
    while t < plan.duration_s:
        size = 1 + (rng.random() < 0.6) + (rng.random() < 0.3)
        for target in rng.sample(targets, min(size, len(targets))):
            start = round(t + rng.uniform(0.0, plan.burst_s), 1)
            if start >= plan.duration_s or busy_until.get(target, -1.0) > start:
                continue
            fault = _one(rng, plan, target, start, kills, last_kill)
            faults.append(fault)
            busy_until[target] = fault.end_s + 0.5
        t += max(1.0, rng.expovariate(1.0 / plan.mean_gap_s))
    if plan.disk_p and rng.random() < plan.disk_p:
        start = round(rng.uniform(plan.duration_s * 2 / 3, plan.duration_s), 1)
        faults.append(Fault(start, DISK_FULL, DISK, round(rng.uniform(*plan.disk_s), 1)))
    return sorted(faults, key=lambda f: (f.t_s, f.target))


def _one(rng: random.Random, plan: Plan, target: str, start: float, kills, last_kill) -> Fault:
    if target in plan.hosts:
        return Fault(start, PARTITION, target, round(rng.uniform(2.0, plan.max_partition_s), 1))
    gap = plan.kill_gap_s.get(target, plan.default_kill_gap_s)
    may_kill = (
        kills.get(target, 0) < plan.max_kills.get(target, plan.default_max_kills)
        and start - last_kill.get(target, -1e9) >= gap
    )
    if may_kill and rng.random() < plan.kill_p:
        kills[target] = kills.get(target, 0) + 1
        last_kill[target] = start
        return Fault(start, KILL, target)
    return Fault(start, STOP, target, round(rng.uniform(1.0, plan.max_stop_s), 1))


def concurrency(faults: list[Fault]) -> int:
    """The most faults under way at one moment (a kill counts for 1 s: its role's restart)."""
    edges = []
    for f in faults:
        edges += [(f.t_s, 1), (f.t_s + max(f.duration_s, 1.0), -1)]
    most = now = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):
        now += step
        most = max(most, now)
    return most


def kills_of(faults: list[Fault]) -> dict[str, int]:
    """Kills per target (the restart budgets a job needs)."""
    out: dict[str, int] = {}
    for f in faults:
        if f.kind == KILL:
            out[f.target] = out.get(f.target, 0) + 1
    return out


def describe(faults: list[Fault]) -> str:
    return "\n".join(f.describe() for f in faults)
