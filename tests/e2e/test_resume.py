"""``asyncrl run`` again in a finished run's directory continues it: the learner resumes from
the newest checkpoint, the actors (which first read the previous learner's address from the
buffer meta) follow the new learner's control plane and receive its weights, and the
summary covers the whole run. Simulated actors keep it short; the learner and Redis are real.
"""

import json
import re

import pytest

from tests.e2e.conftest import needs_full_stack, read_summary, run_cli


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_second_run_in_the_same_directory_resumes_and_actors_follow_the_new_learner(tmp_path):
    needs_full_stack()
    run_dir = tmp_path / "run"
    common = ["run", "experiment=tiny", "learner.nproc=1", "learner.checkpoint_every=3",
              "actor.engine=sim", "actor.num_actors=2", "metrics_port=0", f"run_dir={run_dir}"]  # fmt: skip
    first = run_cli([*common, "learner.steps=6"], timeout=180)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    second = run_cli([*common, "learner.steps=10"], timeout=180)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-4000:]
    assert "resumed from" in out and "at version 6" in out, out[-3000:]
    parts = sorted((run_dir / "config-parts").glob("part-*.json"))  # each part kept
    second_part = json.loads(parts[-1].read_text())
    assert len(parts) == 2 and second_part["from_version"] == 6, parts
    assert second_part["changed"] == {"learner.steps": [6, 10]}, second_part["changed"]
    new_addr = re.search(r"\[learner\] control plane on (\S+)", out).group(1)
    for actor in (0, 1):
        # an actor that read the previous learner's address follows the new one; one that
        # started after the new learner published its address connects there directly
        moved = f"[actor {actor}] the learner's control plane moved to {new_addr} "
        direct = f"[actor {actor}] engine ready; learner control plane at {new_addr}\n"
        assert moved in out or direct in out, out[-3000:]
        assert re.search(rf"\[actor {actor}\] done: .* final weights v10 ", out), out[-3000:]
    s = read_summary(run_dir)
    assert s["steps"] == 10 and s["final_version"] == 10, s
    dropped = sum(s[f"groups_dropped_{k}"] for k in ("stale", "invalid", "poison", "uniform"))
    assert s["groups_committed"] == s["groups_trained"] + dropped + s["groups_still_buffered"], s
    assert s["groups_trained"] == 10 * 4, s  # every step trained batch_groups=4 groups, once
    # the per-process totals continue from the checkpoint too (the first run ended at v6)
    assert s["trained_totals"]["groups"] == 10 * 4, s["trained_totals"]
    assert sum(s["trained_staleness_histogram"].values()) == 10 * 4, s
    assert s["learner_time_s"]["busy"] > 0 and s["train_wall_s"] > 0, s
    # weight syncs: v1..v6 in the first run, the resumed policy at v6, then v7..v10
    assert s["weight_sync"]["count"] == 6 + 1 + 4, s["weight_sync"]


@pytest.mark.timeout(400)
def test_a_new_run_dir_starts_from_another_runs_checkpoint(tmp_path):
    """``learner.resume_from=.../step_V``: weights, optimizer and version from that
    checkpoint, in a new run_dir with its own buffer; a path that is not a checkpoint is
    refused naming it."""
    needs_full_stack()
    common = ["run", "experiment=tiny", "learner.nproc=1", "learner.checkpoint_every=3",
              "actor.engine=sim", "metrics_port=0"]  # fmt: skip
    first = run_cli([*common, "learner.steps=6", f"run_dir={tmp_path / 'a'}"], timeout=180)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    ckpt = tmp_path / "a" / "checkpoints" / "step_000006"
    second = run_cli([*common, "learner.steps=8", f"learner.resume_from={ckpt}",
                      f"run_dir={tmp_path / 'b'}"], timeout=180)  # fmt: skip
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-4000:]
    assert f"started from {ckpt} (learner.resume_from) at version 6" in out, out[-3000:]
    s = read_summary(tmp_path / "b")
    assert s["final_version"] == 8 and s["steps"] == 2, s
    bad = run_cli([*common, "learner.steps=8", f"learner.resume_from={tmp_path / 'a'}",
                   f"run_dir={tmp_path / 'c'}"], timeout=180)  # fmt: skip
    assert bad.returncode != 0
    assert "not a complete checkpoint (no COMPLETE marker" in bad.stdout + bad.stderr
