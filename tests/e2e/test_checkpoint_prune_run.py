"""``learner.keep_checkpoints`` in runs that reach a prune, with a damaged newest checkpoint
(issue 43 round 4: prunes were tested only on directories made by hand).

Two ``asyncrl run`` jobs on one run_dir, the simulated engine (real redis-server, learner
and actor processes): the first keeps every checkpoint; its newest shard is then truncated;
the second resumes with ``keep_checkpoints=1``. It must fall back to the intact checkpoint
(naming the damaged one), train on, and prune only once a newer checkpoint is sealed and
verified, ending with one intact checkpoint.
"""

from __future__ import annotations

import pytest

from asyncrl.learner.state.checkpoint import verify_checkpoint
from tests.e2e.conftest import needs_full_stack, read_summary, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.redis]

SIM = ["experiment=tiny", "actor.engine=sim", "metrics_port=0", "learner.checkpoint_every=1"]


def test_a_resume_past_a_damaged_checkpoint_prunes_only_behind_a_verified_one(tmp_path):
    needs_full_stack()
    run_dir = tmp_path / "run"
    first = run_cli(["run", *SIM, "learner.steps=2", "learner.keep_checkpoints=0",
                     f"run_dir={run_dir}"], timeout=300)  # fmt: skip
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    ckpts = run_dir / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_000001", "step_000002"]
    shard = next((ckpts / "step_000002" / "dcp").glob("*.distcp"))
    with shard.open("r+b") as f:
        f.truncate(1000)  # the newest is damaged

    second = run_cli(["run", *SIM, "learner.steps=4", "learner.keep_checkpoints=1",
                      f"run_dir={run_dir}"], timeout=300)  # fmt: skip
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-4000:]
    assert "step_000002 is damaged: dcp/" in out and "resuming from step_000001" in out, out
    for v in (1, 2, 3):  # each went only after a newer one was sealed and verified
        assert f"removed checkpoint step_{v:06d} (learner.keep_checkpoints=1)" in out, out
    left = sorted(ckpts.glob("step_*"))
    assert [p.name for p in left] == ["step_000004"]
    assert verify_checkpoint(left[0]) is None
    s = read_summary(run_dir)
    assert s["steps"] == 4 and s["final_version"] == 4 and s["ledger"]["balanced"], s
