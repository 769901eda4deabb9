"""`asyncrl run episode.agent=...`: a user's agent (tests/e2e/chain_agent.py, the plain
``openai`` client) owns the episodes end to end on the demo model: real redis-server, a real
vLLM actor serving the agent endpoint, agent worker processes, the learner. Every group holds
each way an agent episode ends (answered, raised, no call, past its deadline), with
``episode.max_env_failure_frac=1`` so the failures do not stop the run, and one episode of two
call chains (a sub-agent's call first), trained whole under ``episode.agent_export=all``:
its second chain is a sample of its own sharing the episode's reward."""

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import needs_full_stack, read_metrics, read_summary, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.redis]

AGENT = Path(__file__).with_name("chain_agent.py")
STEPS, GROUPS, N = 2, 2, 6
ARGS = [
    "experiment=tiny", f"learner.steps={STEPS}", f"learner.batch_groups={GROUPS}",
    f"sampling.n_samples={N}", "model.sft_chat_turns=2",  # the chat model the chain tests use
    f"episode.agent={AGENT}:agent", "episode.env_workers=1", "episode.agent_timeout_s=2",
    "episode.max_env_failure_frac=1", "episode.max_tokens=96", "data.max_prompt_length=80",
    "episode.agent_export=all",
]  # fmt: skip
FAILED = ("agent_error", "no_call", "agent_timeout")


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory):
    needs_full_stack()
    run_dir = tmp_path_factory.mktemp("agent")
    proc = run_cli(["run", *ARGS, f"run_dir={run_dir}"], timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return run_dir, proc.stdout


def test_the_actor_serves_the_agents_on_loopback(agent_run):
    _, out = agent_run
    assert "[actor 0] agent endpoint on http://127.0.0.1:" in out


def test_every_step_trains_the_agents_episodes_and_counts_how_they_ended(agent_run):
    run_dir, _ = agent_run
    records = read_metrics(run_dir)
    assert [r["version"] for r in records] == list(range(1, STEPS + 1))
    for r in records:
        ends = {k.removeprefix("episode/end_"): r[k] for k in r if k.startswith("episode/end_")}
        assert sum(ends.values()) == pytest.approx(1.0)
        for end in FAILED:  # one episode of each group's N
            assert ends.get(end, 0) == pytest.approx(1 / N), (end, ends)
        assert ends.get("done", 0) + ends.get("length", 0) == pytest.approx(3 / N)
        # the sub-agent's chain is a row of its own: 7 rows for each group's 6 episodes
        assert r["samples_per_episode"] == pytest.approx((N + 1) / N)


def test_the_summary_counts_each_end_and_the_ledger_balances(agent_run):
    run_dir, _ = agent_run
    s = read_summary(run_dir)
    trained = s["groups_trained"]
    assert trained == STEPS * GROUPS and s["ledger"]["balanced"], s["ledger"]
    assert s["groups_committed"] == (
        trained + s["groups_dropped_stale"] + s["groups_dropped_invalid"]
        + s["groups_dropped_poison"] + s["groups_dropped_uniform"] + s["groups_still_buffered"]
    )  # fmt: skip
    by_end = s["episodes"]["by_end"]  # episodes, not rows
    assert sum(by_end.values()) == trained * N
    assert s["trained_totals"]["samples"] == trained * (N + 1)
    for end in FAILED:
        assert by_end[end] == trained, (end, by_end)
    assert by_end.get("done", 0) + by_end.get("length", 0) == 3 * trained


def test_the_actor_counts_the_agents_calls_and_failures(agent_run):
    run_dir, _ = agent_run
    stats = json.loads((run_dir / "actor0.json").read_text())
    agents, episodes = stats["agents"], stats["episodes"]
    ends = agents["ends"]
    # agents count each episode as it ends, groups count whole groups: episodes of the groups
    # cut short by the run's end are in the first only
    assert agents["episodes"] == sum(ends.values()) >= episodes["episodes"] >= STEPS * GROUPS * N
    assert all(ends[end] >= 1 for end in FAILED), ends
    causes = {"raised": ends["agent_error"], "no_call": ends["no_call"]}
    assert agents["causes"] == causes | {"timeout": ends["agent_timeout"]}, agents
    assert any("RuntimeError: the agent gave up after" in r for r in agents["reasons"])
    # each answering episode calls twice, the second call extending the first; the raising
    # one calls once; the others never
    answered = ends.get("done", 0) + ends.get("length", 0)
    calls = agents["calls"]
    assert set(calls) == {"first", "new", "extend"}, calls  # new: the sub-agent's chain first
    assert calls["first"] >= answered + ends["agent_error"] and calls["extend"] >= answered
    assert calls["new"] >= episodes["parts"] >= STEPS * GROUPS
    assert answered + ends["agent_error"] <= agents["segments"] <= calls["first"] + calls["new"]
    assert agents["segments_dropped"] == 0 and episodes["parts_dropped"] == 0
    assert not set(agents["refused"]) - {"ended"} and agents["retries"] == 0, agents
