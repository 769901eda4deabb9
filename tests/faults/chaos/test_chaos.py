"""The chaos run (issue 43): faults of every kind together, on a schedule drawn from a seed,
then an independent checker of what docs/reliability.md promises (checker.py).

``test_chaos_single_host``: a simulated-engine ``asyncrl run`` (2 actors, 1 learner rank, its
redis-server) while the schedule SIGKILLs and SIGSTOPs actors, the learner rank and
redis-server, and fills the disk of ``learner.checkpoint_dir`` (a small tmpfs; skipped, and
said, where it cannot be mounted), several at once; ``actor.restart_max`` and
``learner.restart_max`` bring roles back, the launcher Redis.

``test_chaos_across_hosts``: the same roles as separate ``asyncrl launch`` commands on three
hosts (network namespaces, tests/multihost; root), with partitions of each host added to the
kills and stops. Under ``ASYNCRL_FAULTS_FULL=1`` (or with ``ASYNCRL_CHAOS_SEED``) only.

After the schedule, every fault healed, the job must train on (a step after the last fault)
and end by itself (``learner.max_wall_s``) with exit 0, or, if a disk fill met a checkpoint,
fail naming the full disk without restarting the learner (an error a restart cannot fix).
Either way the checker then judges what the job left.

Seeds: ``ASYNCRL_CHAOS_SEED=<seed>[,<seed>...]``, else a fixed list (one in ``make test``,
several and a longer schedule under ``ASYNCRL_FAULTS_FULL=1``); ``ASYNCRL_CHAOS_SECONDS`` sets
how long faults keep starting. A failure starts with the seed and the command that replays
it (the same schedule; the timing of the processes differs from run to run). The job's
files, the AOF links and the fault log stay in the test's tmp directory (kept for failed
tests); ``python -m tests.faults.chaos.checker <tmp>/chaos`` checks them again.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.faults.chaos import checker
from tests.faults.chaos.harness import (
    Injector,
    Observer,
    Targets,
    find_role,
    mount_small_disk,
    redis_pid,
    unmount,
)
from tests.faults.chaos.schedule import (
    DISK_FULL,
    KILL,
    STOP,
    Plan,
    concurrency,
    describe,
    draw,
    kills_of,
)
from tests.faults.conftest import FULL
from tests.multihost.conftest import hosts_factory as hosts_factory  # the fixture
from tests.roles import Proc

pytestmark = [pytest.mark.faults, pytest.mark.redis, pytest.mark.slow]

SIM = ("actor.engine=sim", "actor.sim_tokens_per_s=500", "experiment=tiny")
MAKE_TEST_SEED, MAKE_TEST_FAULTS_S = 40, 25.0
"""``make test``'s schedule: 25 s of seed 40 hold 12 faults, up to 3 at once, among them a
SIGSTOP and a SIGKILL of each actor, the learner rank and redis-server, each SIGSTOP clear of a
restart (``test_make_tests_schedule_stops_and_kills_every_role``): every fault of a
single-host run but the disk fill."""
DEFAULT_SEEDS = (11, 4, 22) if FULL else (MAKE_TEST_SEED,)
FAULTS_S = float(os.environ.get("ASYNCRL_CHAOS_SECONDS", 240.0 if FULL else MAKE_TEST_FAULTS_S))
"""How long faults keep starting (``ASYNCRL_CHAOS_SECONDS`` sets it)."""
HEAL_S = 40.0
"""After the last fault may have started: its end (at most 12 s), then quiet training."""
SILENCE_S = 45.0
RESTART_S = 10.0
"""Longer than a killed role is gone (a learner rank was back 3 s after its SIGKILL here)."""
TIMEOUT_S = int(FAULTS_S + HEAL_S + 540)


def _seeds() -> list[int]:
    given = os.environ.get("ASYNCRL_CHAOS_SEED", "").strip()
    return [int(s) for s in given.split(",") if s.strip()] if given else list(DEFAULT_SEEDS)


def replay_hint(seed: int, test: str) -> str:
    full = "ASYNCRL_FAULTS_FULL=1 " if FULL else ""
    return (
        f"seed {seed}: replay with `{full}ASYNCRL_CHAOS_SEED={seed} pytest tests/faults/chaos "
        f"-k {test}`"
    )


def _common(schedule, ckpt: Path) -> list[str]:
    """The overrides every role of a chaos job gets: restart budgets for the schedule's
    kills, short leases (a killed actor's slots come back in 5 s), short sync deadlines."""
    kills = kills_of(schedule)
    actor_kills = max([n for t, n in kills.items() if t.startswith("actor")], default=0)
    return [*SIM, "actor.num_actors=2", "learner.steps=1000000",
            f"learner.max_wall_s={FAULTS_S + HEAL_S}", "learner.checkpoint_every=20",
            "learner.keep_checkpoints=3", f"learner.checkpoint_dir={ckpt}",
            f"learner.restart_max={kills.get('learner', 0) + 1}",
            f"actor.restart_max={actor_kills + 1}", "learner.weight_sync_timeout_s=15",
            "buffer.lease_ttl_s=5"]  # fmt: skip


@dataclass
class Job:
    """A chaos job as the driver sees it."""

    main: Proc
    """The process whose exit ends the job (``asyncrl run``, or the learner's launcher)."""
    run_dir: Path
    """The learner's run directory (config.json, metrics.jsonl, learner.log)."""
    redis_dir: Path
    checkpoints: Path
    consoles: dict[str, Path]
    """Launcher outputs (``console`` first: the one with the step lines)."""
    targets: Targets
    others: list[Proc] = field(default_factory=list)
    """Launchers that end after ``main``: their exit 0 is expected once it ended."""
    last: Proc | None = None
    """A launcher stopped with Ctrl-C at the end (the buffer's)."""


def _single_host_plan(duration_s: float) -> Plan:
    return Plan(duration_s=duration_s, disk_p=0.5)


def test_make_tests_schedule_stops_and_kills_every_role():
    """The short schedule of ``make test`` stops and kills every process of the job, some
    faults at once (a shorter schedule, or another seed, must keep that). A stop within
    ``RESTART_S`` of a kill of its target does not count: it finds no process while the
    launcher restarts it (``not running (a restart under way)`` in the fault log)."""
    schedule = draw(MAKE_TEST_SEED, _single_host_plan(MAKE_TEST_FAULTS_S))
    killed: dict[str, float] = {}
    landed = set()
    for f in schedule:
        if f.kind == KILL:
            killed[f.target] = f.t_s
        if f.kind == KILL or f.t_s - killed.get(f.target, -1e9) > RESTART_S:
            landed.add((f.kind, f.target))
    wanted = {(kind, target) for kind in (KILL, STOP) for target in Plan(1.0).processes}
    assert wanted <= landed, (sorted(wanted - landed), describe(schedule))
    assert concurrency(schedule) >= 3, describe(schedule)


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("seed", _seeds(), ids=lambda s: f"seed{s}")
def test_chaos_single_host(seed, tmp_path, roles):
    schedule = draw(seed, _single_host_plan(FAULTS_S))
    run_dir, ckpt = tmp_path / "run", tmp_path / "ckpt"
    no_disk = mount_small_disk(ckpt, 96)
    try:
        main = roles.cli("job", "run", *_common(schedule, ckpt), "learner.nproc=1",
                         "metrics_port=0", f"run_dir={run_dir}")  # fmt: skip
        targets = Targets(lambda name: find_role(run_dir, name), disk=None if no_disk else ckpt)
        job = Job(main, run_dir, run_dir / "redis", ckpt / "checkpoints", {"console": main.log},
                  targets)  # fmt: skip
        drive(seed, schedule, job, tmp_path / "chaos", roles, "single_host", no_disk)
    finally:
        if no_disk is None:
            unmount(ckpt)


@pytest.mark.multihost
@pytest.mark.timeout(TIMEOUT_S + 120)
@pytest.mark.parametrize("seed", _seeds(), ids=lambda s: f"seed{s}")
def test_chaos_across_hosts(seed, tmp_path, roles, hosts_factory):  # noqa: F811
    if not FULL and not os.environ.get("ASYNCRL_CHAOS_SEED"):
        pytest.skip("a full-suite test: ASYNCRL_FAULTS_FULL=1 or ASYNCRL_CHAOS_SEED=<seed>")
    from tests.multihost.cluster import Cluster

    hosts = hosts_factory(["learner0", "actors", "redis"])
    cluster = Cluster(hosts, roles, tmp_path)
    schedule = draw(seed, Plan(duration_s=FAULTS_S, hosts=("learner0", "actors", "redis")))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    common = _common(schedule, ckpt)
    buffer = cluster.start_buffer()
    main = cluster.start("learner0", "learner", *common, "learner.nproc=1",
                         f"buffer.url_file={cluster.url_file('learner')}")  # fmt: skip
    actors = cluster.start_actors(*common)

    def find(name: str) -> int | None:
        if name == "redis":
            return redis_pid(tmp_path / "redis")
        return find_role(tmp_path / ("learner0" if name == "learner" else "actors"), name)

    targets = Targets(find, hosts.partition, hosts.heal)
    consoles = {"console": main.log, "console-actors": actors.log, "console-buffer": buffer.log}
    job = Job(main, tmp_path / "learner0", tmp_path / "redis" / "redis", ckpt / "checkpoints",
              consoles, targets, [actors], buffer)  # fmt: skip
    drive(seed, schedule, job, tmp_path / "chaos", roles, "across_hosts")


def drive(seed: int, schedule, job: Job, chaos: Path, roles, test: str, no_disk=None) -> None:
    """Run ``schedule`` on ``job`` from its first step, wait for its end, check; fail with the
    seed, the replay command, the violations and the evidence's place."""
    hint = replay_hint(seed, test)
    print(f"\n{hint}\nschedule:\n{describe(schedule)}")
    chaos.mkdir()
    for p in (job.main, *job.others):
        roles.release(p)  # their ends are judged below
    logs = {**job.consoles, "learner": job.run_dir / "learner.log"}
    observer = Observer(chaos, job.redis_dir / "appendonlydir", logs)
    observer.start()
    injector, t0, code, healed = None, time.time(), None, 0
    try:
        roles.wait_until(lambda: observer.steps >= 1 or job.main.poll() is not None, 300,
                         "a first step")  # fmt: skip
        assert job.main.poll() is None, f"no first step:\n{job.main.tail()}"
        t0 = time.time()
        over = lambda: job.main.poll() is not None or observer.failed  # noqa: E731
        injector = Injector(schedule, job.targets, chaos, t0, over)
        injector.start()
        injector.join(FAULTS_S + 90)
        assert not injector.is_alive(), "the schedule did not finish"
        healed = observer.steps
        roles.wait_until(lambda: observer.steps > healed or job.main.poll() is not None, 180,
                         "a step after the last fault")  # fmt: skip
        code = roles.wait(job.main, FAULTS_S + HEAL_S + 300 - (time.time() - t0))
        codes = {p.name: roles.wait(p, 120) for p in job.others}
        if job.last is not None:
            codes[job.last.name] = roles.signal(job.last, signal.SIGINT, 120)
    except AssertionError as e:  # a hang or a death: the seed first, as for a violation
        raise AssertionError(f"{hint}\n{e}") from None
    finally:
        if injector is not None and injector.is_alive():
            injector.abort()
        observer.stop()
    end = time.time()
    kept = chaos / "checkpoints"  # off the small disk, which goes with the test
    if job.checkpoints.is_dir():
        shutil.copytree(job.checkpoints, kept, symlinks=True)
    (chaos / "run.json").write_text(json.dumps({
        "run_dir": str(job.run_dir), "checkpoints": str(kept),
        "redis_dir": str(job.redis_dir), "start": t0, "end": end, "seed": seed, "exit": code,
    }))  # fmt: skip
    out = job.main.output()
    problems = list(injector.errors) + observer.problems
    problems += _ending(code, out, injector.done, healed, observer)
    problems += [f"{name} exited {c}" for name, c in codes.items() if c not in (0, 130)]
    violations, seen = checker.check(checker.Evidence.load(chaos), SILENCE_S)
    done = "\n".join(
        f"  {d.kind} {d.target} at {d.t - t0:.1f}s"
        + (f" until {d.end - t0:.1f}s" if d.end else "")
        + (f" ({d.note})" if d.note else "")
        for d in injector.done
    )
    report = f"exit {code}; faults injected:\n{done}\nchecked: {json.dumps(seen)}"
    if no_disk:
        report += f"\ndisk faults skipped: {no_disk}"
    print(report)
    assert not problems and not violations, (
        f"{hint}\n"
        + "\n".join(problems + [str(v) for v in violations[:30]])
        + (f"\n... and {len(violations) - 30} more" if len(violations) > 30 else "")
        + f"\n{report}\nevidence: {chaos} (check again: python -m tests.faults.chaos.checker "
        f"{shlex.quote(str(chaos))})\n--- console tail ---\n{out[-4000:]}"
    )


def _ending(code: int | None, out: str, done, healed: int, observer: Observer) -> list[str]:
    """The job's end is one the docs allow: exit 0 (``[asyncrl] done``) after a step since the last
    fault, or, after a disk fill began, a failure naming the full disk without a restart of
    the learner."""
    filled = [d for d in done if d.kind == DISK_FULL and not d.note]
    if code == 0:
        if "[asyncrl] done" not in out:
            return ["exit 0 without `[asyncrl] done`"]
        if observer.steps <= healed:
            return ["no step after the last fault"]
        return []
    if filled and "no space left" in out and "was not restarted" in out:
        return []
    why = "after a disk fill, but not for the full disk" if filled else "with no disk fill"
    return [f"the job failed (exit {code}) {why}"]
