"""`asyncrl run experiment=chain`: multi-turn episodes end to end on the demo model (real
redis-server, real vLLM actor, environment worker processes, the FSDP2 learner), validated
at the start and the end with whole conversations logged."""

import json

import pytest

from tests.e2e.conftest import needs_full_stack, read_metrics, read_summary, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.redis]

STEPS, GROUPS, N = 4, 4, 8
ARGS = ["experiment=chain", f"learner.steps={STEPS}", f"learner.batch_groups={GROUPS}",
        "model.sft_steps=50", "eval.at_start=true", "eval.at_end=true", "eval.max_prompts=8"]  # fmt: skip


@pytest.fixture(scope="module")
def chain_run(tmp_path_factory):
    needs_full_stack()
    run_dir = tmp_path_factory.mktemp("chain")
    proc = run_cli(["run", *ARGS, f"run_dir={run_dir}"], timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return run_dir


def test_every_step_trains_episodes_and_counts_how_they_ended(chain_run):
    records = read_metrics(chain_run)
    assert [r["version"] for r in records] == list(range(1, STEPS + 1))
    for r in records:
        assert 1.0 <= r["episode/turns_mean"] <= 2.0
        ends = sum(r[k] for k in r if k.startswith("episode/end_"))
        assert ends == pytest.approx(1.0)
        assert r["episode/tool_calls_mean"] == 0.0 and 0 < r["episode/model_token_frac"] < 1
    assert any(r["episode/turns_mean"] > 1.0 for r in records), "no second turn was trained"


def test_the_ledger_balances_and_the_episodes_are_in_the_summary(chain_run):
    s = read_summary(chain_run)
    trained = s["groups_trained"]
    assert trained == STEPS * GROUPS
    assert s["groups_committed"] == (
        trained + s["groups_dropped_stale"] + s["groups_dropped_invalid"]
        + s["groups_dropped_poison"] + s["groups_dropped_uniform"] + s["groups_still_buffered"]
    )  # fmt: skip
    assert sum(s["episodes"]["by_end"].values()) == trained * N
    actor = json.loads((chain_run / "actor0.json").read_text())["episodes"]
    assert actor["episodes"] >= trained * N and sum(actor["ends"].values()) == actor["episodes"]
    assert actor["turns"] > actor["episodes"]  # most episodes reach their second turn


def test_validation_runs_episodes_and_logs_whole_conversations(chain_run):
    vals = [json.loads(x) for x in (chain_run / "val.jsonl").read_text().splitlines()]
    assert len(vals) >= 2
    for v in vals:
        assert 1.0 <= v["val/turns"] <= 2.0 and v["val/prompts"] == 8
        text = v["samples"][0]["completion"]
        assert text.startswith("assistant: ") and ("\nuser: what is " in text or v["val/turns"] < 2)
