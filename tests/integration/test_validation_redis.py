"""Validation through a real redis-server: the board hands out every prompt exactly once to
actors validating concurrently; two actors validate a real JSONL validation set with the
simulator engine while the learner's ``Validation`` holds, collects and logs it, with the
text of its first prompts (``eval.log_samples``); an actor holding other weights takes no
part."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from asyncrl.actors.actor import Actor
from asyncrl.actors.data.tasks import build_val_source
from asyncrl.actors.engine.sim import SimEngine
from asyncrl.actors.rewards.math_reward import math_answer_reward
from asyncrl.actors.validation import Validator, validation_size
from asyncrl.buffer.eval_queue import EvalQueue
from asyncrl.buffer.redis_buffer import ReplayBuffer
from asyncrl.core.config.load import load_config
from asyncrl.learner.hub.validation import Validation
from asyncrl.orchestration.demo.tokenizer import save_tokenizer

pytestmark = pytest.mark.redis
VAL = 10


def test_concurrent_claims_hand_out_every_prompt_once(redis_client, buffer_name):
    queue = EvalQueue(ReplayBuffer(redis_client, buffer_name, capacity=8))
    queue.post(7, size=23, chunk=4, samples=3)
    request = queue.request()
    assert request == {"version": 7, "size": 23, "chunk": 4, "samples": 3}
    got: list[int] = []
    lock = threading.Lock()

    def claim_all():
        while (span := queue.claim(request)) is not None:
            with lock:
                got.extend(span)

    threads = [threading.Thread(target=claim_all) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(got) == list(range(23))
    assert queue.claim(request) is None
    queue.requeue(7, [20, 4])  # an actor holding them died: the others take them
    assert [queue.claim(request), queue.claim(request)] == [range(20, 23), range(4, 8)]
    for i in range(3):
        queue.put(7, {"index": i})
    redis_client.rpush(f"{buffer_name}:eval:7:results", b"{torn")
    assert [r.get("index") for r in queue.results(7)] == [0, 1, 2, None]
    assert queue.results(7, 3) == [{"malformed": repr(b"{torn")}]
    queue.finish(7)
    assert queue.request() is None and not redis_client.exists(f"{buffer_name}:eval:7:results")
    # a request without "samples" (an older learner) asks for no text
    redis_client.set(f"{buffer_name}:eval:request", b'{"version": 8, "size": 2, "chunk": 1}')
    assert queue.request() == {"version": 8, "size": 2, "chunk": 1, "samples": 0}
    redis_client.set(f"{buffer_name}:eval:request", b"not json")
    with pytest.raises(ValueError, match="not valid JSON with version, size and chunk"):
        queue.request()
    queue.clear()
    assert not list(redis_client.scan_iter(f"{buffer_name}:eval:*"))


@pytest.fixture
def setup(tmp_path, buffer_name):
    model_dir = tmp_path / "model"
    save_tokenizer(model_dir)
    (model_dir / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    rows = [json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(VAL)]
    train.write_text("".join(rows))
    val.write_text("".join(rows))
    cfg = load_config(["task=file", f"data.train_files=[{train}]", f"data.val_files=[{val}]",
                       "eval.every=2", "eval.chunk_prompts=3", "actor.num_actors=2",
                       f"buffer.name={buffer_name}", "task.reward_executor=thread"])  # fmt: skip
    return cfg, str(model_dir)


def test_two_actors_validate_the_set_once_and_the_learner_logs_it(redis_client, setup):
    cfg, model_dir = setup
    buf = ReplayBuffer(redis_client, cfg.buffer.name, capacity=16)
    source = build_val_source(cfg, model_dir, print)
    size = validation_size(cfg, source)
    assert size == VAL
    buf.set_meta(val_prompts=size)
    logged: list[dict] = []
    learner = Validation(cfg, buf, logged.append, print)
    assert learner.due(2)
    learner.request(2)
    validators = []
    for actor_id, version in ((0, 2), (1, 2), (2, 1)):  # actor 2 holds other weights
        engine = SimEngine(64, 1e5, 3.0, seed=actor_id)
        actor = Actor(cfg, actor_id, model_dir, buf, engine, source, math_answer_reward)
        actor.state.version = engine.version = version
        validators.append(Validator(actor, source, size, EvalQueue(buf)))

    async def main():
        tasks = [asyncio.create_task(v.run()) for v in validators]
        for _ in range(200):
            learner.poll(step=3)
            if not learner.holding:
                break
            await asyncio.sleep(0.05)
        for v in validators:
            v.actor.state.stop = True
        await asyncio.gather(*tasks)

    asyncio.run(asyncio.wait_for(main(), 60))
    (record,) = logged
    assert record["val/version"] == 2 and record["val/prompts"] == VAL
    assert record["val/complete"] == 1 and record["val/off_version"] == 0
    # math_answer_reward is 0 or 1 and each prompt has one sample: the reward is a count of
    # the VAL prompts answered right, and pass@1 that same fraction
    right = record["val/reward"] * VAL
    assert right == pytest.approx(round(right)) and record["val/pass@1"] == record["val/reward"]
    # eval.log_samples (3): the text of prompts 0..2 came through Redis as JSON
    assert [s["index"] for s in record["samples"]] == [0, 1, 2]
    assert [s["prompt"] for s in record["samples"]] == [source.get(i).text for i in range(3)]
    assert all(isinstance(s["completion"], str) for s in record["samples"])
    done = [v.prompts_done for v in validators]
    assert sum(done) == VAL and done[2] == 0  # once each; the off-version actor took none
    assert EvalQueue(buf).request() is None  # withdrawn
