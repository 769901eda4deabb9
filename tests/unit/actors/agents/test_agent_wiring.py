"""An actor's ``GroupMaker`` with ``episode.agent`` set (asyncrl/actors/groups.py
``agent_groups``): the endpoint started and closed with it, agent worker processes, calls to
the actor's own engine. The simulated engine (``actor.engine=sim``) serves the calls as any
engine does (random tokens through ``generate_whole``), so the wiring runs here without vLLM;
only aiohttp (the endpoint) and openai (the fake agent) are needed."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("openai", reason="openai comes with vLLM; install vllm to run")
pytest.importorskip("aiohttp", reason="aiohttp comes with vLLM; install vllm to run")

from asyncrl.actors.data.prompt import Prompt  # noqa: E402
from asyncrl.actors.engine.sim import SimEngine  # noqa: E402
from asyncrl.actors.groups import GroupMaker  # noqa: E402
from asyncrl.core.config.load import load_config  # noqa: E402
from asyncrl.orchestration.demo.tokenizer import build_tokenizer  # noqa: E402
from tests.fakes.agents import spec_of  # noqa: E402

pytestmark = pytest.mark.timeout(60)
TOK = build_tokenizer()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


class Prompts:
    """One chat question per index, played by the fake agent's ``answers`` part."""

    end = None

    def get(self, index: int) -> Prompt:
        fields = {"part": "answers", "result": {"score": 1.0, "index": index}}
        messages = [{"role": "user", "content": f"what is {index}+1?"}]
        return Prompt(index, f"{index}+1=", fields, messages=messages)


class Scorer:
    """The task's scorer; asked to score nothing here (the agent scores its episodes)."""

    async def score_all(self, prompt, texts, fields):
        assert texts == [], "the agent's score was None"
        return []


def test_a_group_makers_agent_episodes_run_on_the_actors_engine(capsys):
    cfg = load_config(
        [
            f"episode.agent={spec_of('plays')}",
            "actor.engine=sim",
            "episode.env_workers=1",
            "sampling.n_samples=3",
            "sampling.max_tokens=6",
        ]
    )
    engine = SimEngine(len(TOK), tokens_per_s=1e5, mean_len=3.0, seed=1)
    maker = GroupMaker(cfg, 0, engine, Prompts(), TOK, Scorer())

    async def run():
        await maker.start()
        try:
            group = await maker.make(5)
        finally:
            await maker.close()
        return group

    group = asyncio.run(asyncio.wait_for(run(), 40))
    url = maker.agents.server.base_url
    assert f"[actor 0] agent endpoint on {url}\n" in capsys.readouterr().out
    assert (group.group_id, len(group.samples)) == (f"{cfg.task.seed}:5", 3)
    for s in group.samples:
        assert s.episode_end in ("done", "length") and s.reward == 1.0
        assert s.reward_extras == {"index": 5.0} and 1 <= s.model_tokens <= 6
    counts = maker.agents.counts.to_dict()
    assert counts["calls"] == {"first": 3} and counts["episodes"] == 3
    assert maker.episodes.counts.episodes == 3 and maker.activity.generating == 0
    assert maker.agents.server._runner is None and maker.episodes.host.pids == []  # closed
    # validation: the same endpoint and counts, greedy at eval.n_samples=1
    assert maker.eval_episodes.runner.policy.temperature == 0.0
    assert maker.eval_episodes.runner.counts is maker.agents.counts


def test_an_actors_stats_carry_the_agents_counts(tmp_path):
    from asyncrl.actors.actor import Actor
    from asyncrl.actors.data.addition import AdditionSource, addition_reward
    from asyncrl.buffer.testing import UnreachableBuffer
    from asyncrl.orchestration.demo.tokenizer import save_tokenizer
    from tests.fakes.engines import ScriptedEngine

    save_tokenizer(tmp_path)
    cfg = load_config([f"episode.agent={spec_of('plays')}", "task.reward_executor=thread"])
    prompts = AdditionSource(seed=7, split="train")
    buffer = UnreachableBuffer(cfg.buffer.name)  # the stats read no buffer
    actor = Actor(cfg, 0, str(tmp_path), buffer, ScriptedEngine(), prompts, addition_reward)
    try:
        stats = actor.stats()
    finally:
        actor.scorer.close()
    assert stats["agents"]["episodes"] == 0 and stats["agents"]["calls"] == {}
    assert stats["episodes"]["episodes"] == 0
