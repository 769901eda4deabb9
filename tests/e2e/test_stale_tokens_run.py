"""``algorithm.stale_tokens=mask`` and ``=interpolate`` in whole runs where tokens do span
versions (issue 43: no end-to-end run had masked a token, and ``interpolate`` ran in none).

Multi-turn episodes on the demo model (``experiment=chain``: real redis-server, a real vLLM
actor, environment worker processes, the FSDP2 learner) whose every environment step waits
0.5 s (``benchmarks/multi_turn/slow_env.py``): a weight sync often lands between an episode's
two turns, so its first answer was sampled one version before its second. At
``buffer.max_staleness=0`` such a group is admitted by its newest token, and its older tokens
are past the bound: ``mask`` leaves them out of the loss, ``interpolate`` trains them with an
estimated proximal policy. Each run asserts on what its steps did with those tokens.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import REPO, needs_full_stack, read_metrics, read_summary, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.redis]

STEPS, GROUPS, N = 6, 4, 8  # experiment=chain: 8 episodes a group
ARGS = ["experiment=chain", "model.sft_steps=50", f"learner.steps={STEPS}",
        f"learner.batch_groups={GROUPS}", "eval.at_start=false", "eval.at_end=false",
        "eval.every=0", "episode.env=benchmarks.multi_turn.slow_env:SlowChain",
        "buffer.max_staleness=0"]  # fmt: skip
SLOW_ENV = {"ASYNCRL_BENCH_ENV_MEDIAN_S": "0.5", "ASYNCRL_BENCH_ENV_P99_S": "1.0",
            "PYTHONPATH": str(REPO)}  # fmt: skip


def _run(tmp_path_factory, mode: str):
    needs_full_stack()
    run_dir = tmp_path_factory.mktemp(mode)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in SLOW_ENV.items():
            mp.setenv(key, value)
        proc = run_cli(["run", *ARGS, f"algorithm.stale_tokens={mode}", f"run_dir={run_dir}"],
                       timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return read_metrics(run_dir), read_summary(run_dir)


@pytest.fixture(scope="module")
def masked(tmp_path_factory):
    return _run(tmp_path_factory, "mask")


@pytest.fixture(scope="module")
def interpolated(tmp_path_factory):
    return _run(tmp_path_factory, "interpolate")


def _model_tokens(r: dict) -> int:
    """The step's completion tokens before any masking: mean length x samples."""
    return round(r["response_len_mean"] * r["groups"] * N)


def _older_than_bound(s: dict) -> int:
    """Trained tokens sampled more than ``max_staleness`` (0) versions before their step."""
    return sum(n for age, n in s["trained_token_staleness_histogram"].items() if int(age) > 0)


def test_mask_leaves_the_tokens_older_than_the_bound_out_of_the_loss(masked):
    records, s = masked
    assert [r["version"] for r in records] == list(range(1, STEPS + 1))
    spanned = [r for r in records if r["tokens_masked_stale"] > 0]
    assert spanned, "no trained episode spanned a weight sync: nothing was masked"
    for r in records:  # the loss's token count is the batch's, less what was masked
        assert r["tokens"] == _model_tokens(r) - r["tokens_masked_stale"], r
        assert r["staleness_token_mean"] > 0 or r["tokens_masked_stale"] == 0, r
    # groups are admitted by their newest token: one a version old is trained, its old head not
    assert s["max_trained_staleness"] >= 1 and s["max_staleness"] == 0, s
    masked_total = sum(int(r["tokens_masked_stale"]) for r in records)
    assert s["trained_tokens_masked_stale"] == masked_total == _older_than_bound(s), s
    assert s["ledger"]["balanced"], s["ledger"]


def test_interpolate_trains_the_tokens_older_than_the_bound(interpolated):
    records, s = interpolated
    assert [r["version"] for r in records] == list(range(1, STEPS + 1))
    old = sum(int(r["tokens_masked_stale"]) for r in records)  # counted, not masked
    assert old > 0, "no trained episode spanned a weight sync"
    for r in records:  # every completion token is in the loss, the old ones included
        assert r["tokens"] == _model_tokens(r), r
        assert r["loss"] == r["loss"] and abs(r["loss"]) < 1e3, r  # finite, bounded
    assert s["trained_tokens_masked_stale"] == 0, s  # none left the loss
    assert _older_than_bound(s) == old > 0, s
    assert s["max_trained_staleness"] >= 1 and s["ledger"]["balanced"], s
