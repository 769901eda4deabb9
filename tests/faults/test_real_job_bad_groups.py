"""Guarantees 6 and 7 in a real job, and done-when 3's opt-in learner restart.

A real ``asyncrl run`` (torchrun learner + a simulated-engine actor, private redis-server):

- malformed entries are XADDed into the live buffer stream while the learner trains (the
  generators of tests/faults/test_malformed.py): the learner dead-letters each as
  ``dropped_invalid`` and keeps training;
- one group the actor commits crashes the learner step every time (the test-only failpoint
  ``learner.step/<group_id>``, armed through the environment): with ``learner.restart_max``
  the launcher restarts the learner, which resumes from its checkpoint and re-reads the group,
  until after ``buffer.max_deliveries`` crashed steps it is dead-lettered as poison; the run
  then finishes with exit 0, the restarts counted and the conservation law in summary.json.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from tests.faults.test_supervision import Launcher, procs_mentioning

pytestmark = [pytest.mark.faults, pytest.mark.redis, pytest.mark.slow]

STEPS, BATCH, MAX_DELIVERIES = 10, 4, 2
TASK_SEED, POISON_INDEX = 11, 9  # the actor's group ids are "<task.seed>:<prompt index>"


def inject_malformed(run_dir: Path, name: str, per_kind: int) -> int:
    """XADD ``per_kind`` bad entries of every generator (but oversized: the learner's limit
    is the config's) into the live stream, counted as committed; returns how many."""
    from asyncrl.buffer.connection import connect
    from asyncrl.buffer.testing import add_as_committed
    from tests.faults.test_malformed import GENERATORS

    client = connect((run_dir / "redis" / "redis.url").read_text().strip(), timeout_s=5.0)
    rng, n = random.Random(3), 0
    try:
        for kind, gen in GENERATORS.items():
            if kind == "oversized":
                continue
            for i in range(per_kind):
                fields, _ = gen(rng, f"bad-{kind}-{i}")
                add_as_committed(client, name, fields)
                n += 1
    finally:
        client.close()
    return n


@pytest.mark.timeout(420)
def test_real_job_dead_letters_malformed_and_poison_groups_and_finishes(tmp_path, roles):
    from tests.e2e.conftest import needs_full_stack

    needs_full_stack()
    run_dir, name = tmp_path / "run", "badjob"
    poison = f"{TASK_SEED}:{POISON_INDEX}"
    launcher = Launcher(
        roles, "run", "experiment=tiny", f"learner.steps={STEPS}", "learner.checkpoint_every=2",
        "learner.nproc=1", "learner.restart_max=3", "learner.weight_sync_timeout_s=15",
        f"buffer.max_deliveries={MAX_DELIVERIES}", "buffer.max_staleness=4",
        f"buffer.name={name}", f"task.seed={TASK_SEED}", "actor.engine=sim",
        "actor.sim_tokens_per_s=500", "metrics_port=0", f"run_dir={run_dir}",
        env={"ASYNCRL_FAILPOINTS": f"learner.step/{poison}=raise@0"},
    )  # fmt: skip
    try:
        roles.wait_until(
            lambda: re.search(r"^step +1 \|", launcher.output, re.M),
            300, "the learner to train a step", poll_s=0.5,
        )  # fmt: skip
        injected = inject_malformed(run_dir, name, per_kind=2)
        code = launcher.wait(300)
    finally:
        launcher.stop()
    out = launcher.output
    assert code == 0, out[-4000:]
    assert out.count("learner exited with code 1; restarting it") == MAX_DELIVERIES, out[-4000:]
    restarts = json.loads((run_dir / "run.json").read_text())["role_restarts"]
    assert restarts == {"learner": MAX_DELIVERIES, "actor0": 0}, restarts
    s = json.loads((run_dir / "summary.json").read_text())
    dropped = sum(v for k, v in s.items() if k.startswith("groups_dropped_"))
    assert s["groups_committed"] == s["groups_trained"] + dropped + s["groups_still_buffered"], s
    assert s["groups_trained"] == STEPS * BATCH, s  # every step trained a full batch, once
    assert (s["groups_dropped_invalid"], s["groups_dropped_poison"]) == (injected, 1), s
    log = (run_dir / "learner.log").read_text()
    assert f"failpoint learner.step/{poison}" in log, log[-3000:]
    assert log.count(f"failpoint learner.step/{poison}") == MAX_DELIVERIES, log[-3000:]
    print(f"\nreal job: {injected} malformed entries dead-lettered, poison group {poison} "
          f"dead-lettered after {MAX_DELIVERIES} crashed steps, learner restarted "
          f"{restarts['learner']}x, {s['groups_trained']} trained, {s['groups_committed']} "
          f"committed, exit 0")  # fmt: skip
    assert procs_mentioning(str(run_dir)) == [], "role processes outlived `asyncrl run`"
