"""``max_staleness=0`` against ``mode=sync`` over a whole run, step by step (issue 43: the
only equivalence test was one step, tests/unit/learner/test_sync_equivalence.py).

Three ``asyncrl run`` jobs with the same seed on the simulated engine (real redis-server,
learner and actor processes; ``actor.engine=sim`` samples the same tokens for the same
requests), scored by a pure reward of the text (tests/e2e/token_rewards.py) so that every
step trains:

- ``mode=sync``: ``max_staleness=0`` plus a per-version quota (actors make one batch a
  version);
- asynchronous, ``max_staleness=0``, ``buffer.admission=window``: the window admits no group
  that could not be trained fresh, so the actor makes exactly the groups the learner reads.
  It must train what ``mode=sync`` trained, step for step: the same rewards and token counts,
  the same loss, gradient norm and weights (to float rounding: groups may arrive in another
  order);
- asynchronous, ``max_staleness=0``, ``buffer.admission=capacity`` (the default): the actor
  generates on while the learner trains, and what it made under an older version is dropped
  as stale (21 of 57 groups in a run here), so its batches are other samples than sync's;
  every trained token is still fresh, and every drop is counted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import needs_full_stack, read_metrics, read_summary, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.redis]

STEPS, GROUPS = 8, 4  # experiment=tiny: 4 groups a step
REWARD = Path(__file__).with_name("token_rewards.py")
COMMON = ["experiment=tiny", "actor.engine=sim", f"learner.steps={STEPS}", "metrics_port=0",
          f"task.reward_fn={REWARD}:digit_share"]  # fmt: skip
ARMS = {
    "sync": ["mode=sync"],
    "window": ["buffer.max_staleness=0", "buffer.admission=window"],
    "capacity": ["buffer.max_staleness=0", "buffer.admission=capacity"],
}
SAME = ("reward", "tokens", "response_len_mean", "groups")
"""Per-step figures of what was trained: equal exactly when the same samples trained."""
CLOSE = ("loss", "grad_norm", "weight_norm")
"""Per-step figures of the update: equal to float rounding (the order of groups may differ)."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[list[dict], dict]]:
    needs_full_stack()
    out = {}
    for arm, overrides in ARMS.items():
        run_dir = tmp_path_factory.mktemp(arm)
        proc = run_cli(["run", *COMMON, *overrides, f"run_dir={run_dir}"], timeout=600)
        assert proc.returncode == 0, arm + proc.stdout[-4000:] + proc.stderr[-4000:]
        out[arm] = (read_metrics(run_dir), read_summary(run_dir))
    return out


def _fresh_every_step(records: list[dict], s: dict) -> None:
    assert [r["version"] for r in records] == list(range(1, STEPS + 1))
    for r in records:
        assert r["staleness_max"] == 0 and r["staleness_token_mean"] == 0, r
        assert r["groups"] == GROUPS, r
    assert s["trained_staleness_histogram"] == {"0": STEPS * GROUPS}, s
    dropped = sum(v for k, v in s.items() if k.startswith("groups_dropped_"))
    assert s["groups_committed"] == s["groups_trained"] + dropped + s["groups_still_buffered"], s


def test_every_arm_trains_only_fresh_groups_and_counts_the_rest(runs):
    for arm, (records, s) in runs.items():
        _fresh_every_step(records, s)
        assert s["mode"] == ("sync" if arm == "sync" else "async"), arm
    assert any(r["loss"] != 0 for r in runs["sync"][0]), "nothing trained: the comparison is void"


def test_windowed_staleness_0_trains_what_sync_trains_step_by_step(runs):
    sync, window = runs["sync"][0], runs["window"][0]
    for a, b in zip(sync, window, strict=True):
        for key in SAME:
            assert a[key] == b[key], (a["step"], key, a[key], b[key])
        for key in CLOSE:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-7), (a["step"], key)
    assert runs["window"][1]["groups_dropped_stale"] == 0, runs["window"][1]


def test_capacity_staleness_0_drops_what_went_stale_and_counts_it(runs):
    """Groups made while the learner trained went stale at its next version: dropped, counted
    (``dropped_stale`` is cumulative), and the batches after them are other samples."""
    sync, (cap, s) = runs["sync"][0], runs["capacity"]
    assert s["groups_dropped_stale"] == cap[-1]["dropped_stale"], s
    if s["groups_dropped_stale"]:
        assert [r["reward"] for r in cap] != [r["reward"] for r in sync]
