"""The prompt cursor over a real dataset file and a real redis-server: every prompt of every
epoch is claimed exactly once across actor restarts and several actors; at the end of the
data an actor finishes its groups, marks itself exhausted, and the learner's ``GroupSource``
then ends the run (``DataExhausted``) instead of waiting out ``learner.data_timeout_s``."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from asyncrl.actors.actor import Actor
from asyncrl.actors.data.tasks import build_prompt_source
from asyncrl.actors.engine.sim import SimEngine
from asyncrl.actors.rewards.math_reward import math_answer_reward
from asyncrl.buffer.redis_buffer import ReplayBuffer
from asyncrl.core.config.load import load_config
from asyncrl.learner.hub.data import DataExhausted, GroupSource
from asyncrl.orchestration.demo.tokenizer import save_tokenizer

pytestmark = pytest.mark.redis
PROMPTS = 7


@pytest.fixture
def setup(tmp_path, buffer_name):
    model_dir = tmp_path / "model"
    save_tokenizer(model_dir)
    (model_dir / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n"
                            for i in range(PROMPTS)))  # fmt: skip
    cfg = load_config(["task=file", f"data.train_files=[{data}]", "data.epochs=2",
                       "actor.num_actors=2", f"buffer.name={buffer_name}",
                       "task.reward_executor=thread"])  # fmt: skip
    return cfg, str(model_dir), build_prompt_source(cfg, str(model_dir), print)


def _actor(cfg, actor_id, model_dir, buf, src, engine=None) -> Actor:
    return Actor(cfg, actor_id, model_dir, buf, engine, src, math_answer_reward)


def test_every_prompt_of_every_epoch_is_claimed_once_across_restarts(redis_client, setup):
    cfg, model_dir, src = setup
    buf = ReplayBuffer(redis_client, cfg.buffer.name, capacity=64)
    done: list[int] = []
    for actor_id in range(cfg.actor.num_actors):
        first = _actor(cfg, actor_id, model_dir, buf, src)
        claimed = [first.cursor.next() for _ in range(3)]
        first.cursor.done(claimed[0])  # committed one, then killed with two in flight
        done.append(claimed[0])
        again = _actor(cfg, actor_id, model_dir, buf, src)  # the restart
        assert again.cursor.in_flight() == sorted(claimed[1:])
        while (index := again.cursor.next()) is not None:
            again.cursor.done(index)
            done.append(index)
        assert _actor(cfg, actor_id, model_dir, buf, src).cursor.next() is None  # stays done
    assert sorted(done) == list(range(src.end)) and src.end == 2 * PROMPTS
    assert Counter(src.get(i).text for i in done) == {f"{i}+1=": 2 for i in range(PROMPTS)}


def test_actors_stop_at_the_end_of_the_data_and_the_learner_ends_the_run(redis_client, setup):
    cfg, model_dir, src = setup
    buf = ReplayBuffer(redis_client, cfg.buffer.name, capacity=64)
    for actor_id in range(cfg.actor.num_actors):
        actor = _actor(cfg, actor_id, model_dir, buf, src, SimEngine(64, 1e5, 3.0, seed=actor_id))
        asyncio.run(asyncio.wait_for(actor.produce(), 30))  # returns once out of prompts
        assert actor.state.data_exhausted and actor.state.epoch == 1
        assert buf.meta()[f"exhausted_actor_{actor_id}"] == "1"
    assert buf.meta()["prompts_per_epoch"] == str(PROMPTS)
    assert buf.stats()["committed"] == src.end

    def exhausted() -> bool:
        meta = buf.meta()
        return all(meta.get(f"exhausted_actor_{i}") == "1" for i in range(2))

    learner = GroupSource(buf, "learner", 64, max_staleness=1, timeout_s=60.0,
                          exhausted=exhausted)  # fmt: skip
    got = [e.group.prompt_index for _ in range(3) for e in learner.next_batch(0, 4)]
    with pytest.raises(DataExhausted, match=r"no prompts left .* \(2 group\(s\) of a partial"):
        learner.next_batch(0, 4)  # at once, not after timeout_s
    assert len(got) == 12 and len(set(got)) == 12


class PromptRecordingSim(SimEngine):
    """The simulator, recording the prompt ids of every request."""

    def __init__(self) -> None:
        super().__init__(64, 1e5, 3.0)
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_ids, *args, **kwargs):
        self.prompts.append(list(prompt_ids))
        return await super().generate(prompt_ids, *args, **kwargs)


def test_the_chat_templated_tokens_reach_the_engine(redis_client, tmp_path, setup):
    cfg, model_dir, _ = setup
    chat = [{"role": "user", "content": "2+2="}]
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"prompt": chat, "answer": "4"}) + "\n")
    cfg.data.train_files = [str(data)]
    src = build_prompt_source(cfg, model_dir, print)
    engine = PromptRecordingSim()
    actor = _actor(cfg, 0, model_dir, ReplayBuffer(redis_client, cfg.buffer.name, 8), src, engine)
    group = asyncio.run(actor.make_group(0))
    want = actor.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert want == "user: 2+2=\nassistant: "
    assert engine.prompts == [actor.tokenizer.encode(want)] == [src.get(0).token_ids]
    assert all(s.prompt_ids == engine.prompts[0] for s in group.samples)
