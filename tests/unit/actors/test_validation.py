"""Validation during training: pass@k, the val/* summary, when the learner validates and how
long it holds weight syncs (learner/hub/validation.py), and an actor's records
(actors/validation.py) from a scripted engine."""

from __future__ import annotations

import asyncio
import math
import re
import time

import pytest

from asyncrl.actors.actor import ActorState
from asyncrl.actors.data.addition import AdditionSource, addition_reward
from asyncrl.actors.engine.vllm_engine import Completion
from asyncrl.actors.rewards.scoring import RewardScorer
from asyncrl.actors.validation import Validator, validation_size
from asyncrl.core.config.job import Config
from asyncrl.core.config.load import ConfigError, load_config
from asyncrl.learner.hub.validation import Validation, ks, pass_at_k, samples_of, summarize
from tests.fakes.engines import ScriptedEngine


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 4) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))  # 0.5
    assert pass_at_k(5, 3, 3) == 1.0  # n - c < k: every k-subset holds a solved sample
    assert ks(1) == [1] and ks(4) == [1, 2, 4] and ks(6) == [1, 2, 4, 6]


def test_summarize_means_extras_pass_at_k_and_left_out_records():
    records = [
        {"rewards": [1.0, 0.0], "lengths": [2, 4], "extras": {"acc": [1.0, 0.0]}, "errors": 0},
        {"rewards": [0.5, 0.5], "lengths": [3, 3], "extras": {"acc": [0.0, 0.0]}, "errors": 1},
        {"rewards": [1.0, 1.0], "lengths": [9, 9], "off_version": 1},  # left out
        {"malformed": "'{not json'"},  # left out
    ]
    s = summarize(records, threshold=1.0)
    assert s["val/prompts"] == 2 and s["val/off_version"] == 1 and s["val/malformed"] == 1
    assert s["val/reward"] == pytest.approx(0.5) and s["val/acc"] == pytest.approx(0.25)
    assert s["val/response_length"] == pytest.approx(3.0) and s["val/reward_errors"] == 1
    assert s["val/pass@1"] == pytest.approx(0.25)  # (1/2 + 0) / 2
    assert s["val/pass@2"] == pytest.approx(0.5)  # (1 + 0) / 2
    assert summarize([], 1.0) == {"val/prompts": 0.0, "val/off_version": 0.0, "val/malformed": 0.0}


class FakeBuffer:
    """Meta only; the queue is replaced by ``FakeQueue``."""

    name = "fake"
    client = None

    def __init__(self, size: int):
        self._meta = {"val_prompts": str(size)}

    def meta(self):
        return self._meta


class FakeQueue:
    def __init__(self):
        self.posted, self.records, self.finished, self.requeued = [], [], [], []

    def post(self, version, size, chunk, samples=0):
        self.posted.append((version, size, chunk, samples))

    def requeue(self, version, starts):
        self.requeued.append((version, list(starts)))

    def results(self, version, start=0):
        return self.records[start:]

    def finish(self, version):
        self.finished.append(version)

    def clear(self):
        pass


def _validation(monkeypatch, size=2, **eval_kv) -> tuple[Validation, list, list]:
    import asyncrl.learner.hub.validation as module

    monkeypatch.setattr(module, "EvalQueue", lambda buffer: FakeQueue())
    cfg = Config()
    for k, v in eval_kv.items():
        setattr(cfg.eval, k, v)
    logged, said = [], []
    return Validation(cfg, FakeBuffer(size), logged.append, said.append), logged, said


def test_due_at_start_at_every_interval_once_and_at_end(monkeypatch):
    v, _, _ = _validation(monkeypatch, every=4, at_start=True, at_end=True)
    assert v.due(0, start=True) and not v.due(0) and not v.due(3)
    assert v.due(4) and v.due(5)  # the first sync at or after step 4
    v.request(5)
    assert not v.due(6)  # one at a time
    v.active = None
    assert not v.due(7) and v.due(8) and v.due(9, end=True)
    off, _, _ = _validation(monkeypatch)
    assert not off.due(0, start=True) and not off.due(8) and not off.due(8, end=True)


def test_a_resumed_run_redoes_a_validation_the_kill_interrupted(monkeypatch):
    """Issue 43 round 4: a validation interrupted by a SIGKILL of the launcher was not redone
    after the resume (the resume counted the next interval from its own version). Now it
    counts from the newest version val.jsonl logged."""
    import asyncrl.learner.hub.validation as module

    monkeypatch.setattr(module, "EvalQueue", lambda buffer: FakeQueue())
    cfg = Config()
    cfg.eval.every = 10

    def resumed(logged: set[int]) -> Validation:
        return Validation(cfg, FakeBuffer(2), lambda r: None, lambda t: None, logged)

    assert resumed({10}).due(20, start=True)  # the one at 20 was cut off: run it now
    done = resumed({10, 20})
    assert not done.due(20, start=True) and not done.due(25) and done.due(30)
    fresh = resumed(set())  # never validated (a new run, or resume_from another run's step)
    assert not fresh.due(20, start=True) and fresh.due(30)


def test_hold_until_every_record_is_in_then_log_tagged_with_the_version(monkeypatch):
    v, logged, said = _validation(monkeypatch, size=2, every=2)
    v.request(2)
    assert v.queue.posted == [(2, 2, v.cfg.eval.chunk_prompts, 2)] and v.holding  # 2 samples
    v.queue.records.append({"index": 1, "rewards": [1.0], "lengths": [1], "extras": {}})
    v.queue.records.append({"index": 1, "rewards": [0.0], "lengths": [9], "extras": {}})
    v.poll(step=2)
    assert v.holding and not logged  # 1 of 2 prompts in (a second record of 1 is ignored)
    v.queue.records.append({"index": 0, "rewards": [0.0], "lengths": [3], "extras": {}})
    v.poll(step=3)
    assert not v.holding and v.queue.finished == [2]
    (record,) = logged
    assert record["step"] == 3 and record["val/version"] == 2.0 and record["val/complete"] == 1
    assert record["val/reward"] == 0.5 and record["val/pass@1"] == 0.5
    assert "samples" not in record  # the records carried no text


def _sample(index, completion, reward=1.0, **record):
    sample = {"prompt": f"p{index}", "completion": completion, "reward": reward}
    return {"index": index, "rewards": [reward], "lengths": [1], "sample": sample, **record}


def test_a_validation_logs_the_samples_of_its_first_prompts_in_index_order(monkeypatch):
    v, logged, _ = _validation(monkeypatch, size=10, every=1, log_samples=3)
    v.request(4)
    assert v.queue.posted[0][3] == 3  # the actors are asked for the text of prompts 0..2
    v.queue.records += [_sample(i, f"c{i}", float(i % 2)) for i in (9, 2, 0, 1)]
    v.queue.records += [{"index": i, "rewards": [0.0], "lengths": [1]} for i in range(3, 9)]
    v.poll(step=5)
    (record,) = logged
    assert record["samples"] == [
        {"index": 0, "prompt": "p0", "completion": "c0", "reward": 0.0},
        {"index": 1, "prompt": "p1", "completion": "c1", "reward": 1.0},
        {"index": 2, "prompt": "p2", "completion": "c2", "reward": 0.0},
    ]  # prompt 9's text, which no actor should send, is not shown
    none, logged, _ = _validation(monkeypatch, size=10, every=1, log_samples=0)
    none.request(4)
    none.queue.records += [_sample(i, "c") for i in range(10)]
    none.poll(step=5)
    assert none.queue.posted[0][3] == 0 and "samples" not in logged[0]


def test_samples_of_leaves_out_missing_off_version_and_malformed_samples():
    by_index = {
        0: _sample(0, "whole\n" * 500),
        1: _sample(1, "other weights", off_version=1),
        2: {"index": 2, "rewards": [1.0], "sample": {"prompt": "p2", "completion": 7, "reward": 1}},
        3: {"index": 3, "rewards": [1.0], "sample": "text"},
        4: _sample(4, "", reward=True),  # a bool is not a reward
        6: _sample(6, "", reward=1),
        7: _sample(7, "past the count"),
    }  # 5: did not come back
    assert samples_of(by_index, 7) == [
        {"index": 0, "prompt": "p0", "completion": "whole\n" * 500, "reward": 1.0},
        {"index": 6, "prompt": "p6", "completion": "", "reward": 1.0},
    ]
    assert samples_of(by_index, 0) == []


def test_a_validation_past_its_deadline_logs_what_came_back_and_says_so(monkeypatch):
    v, logged, said = _validation(monkeypatch, size=3, every=1, timeout_s=0.05)
    v.request(1)
    v.queue.records.append({"index": 2, "rewards": [1.0], "lengths": [1], "extras": {}})
    v.wait(step=1, stop=lambda: False)  # returns at the deadline
    (record,) = logged
    assert record["val/complete"] == 0 and record["val/prompts"] == 1
    assert any("timed out" in s and "1/3 prompts" in s for s in said), said


def test_chunks_missing_prompts_are_handed_out_again_after_a_quiet_spell(monkeypatch):
    v, logged, said = _validation(monkeypatch, size=10, every=1, chunk_prompts=4, timeout_s=0.4)
    v.request(1)
    for i in (0, 1, 2, 3, 5):  # chunk 0 whole, chunk 4 partly, chunk 8 not at all
        v.queue.records.append({"index": i, "rewards": [1.0], "lengths": [1], "extras": {}})
    v.poll(step=1)
    assert not v.queue.requeued  # prompts just came in
    time.sleep(0.12)  # > timeout_s / 4 without a new prompt
    v.poll(step=1)
    assert v.queue.requeued == [(1, [4, 8])] and v.holding
    assert any("handing 2 chunk(s) out again" in s for s in said), said
    for i in (4, 6, 7, 8, 9):
        v.queue.records.append({"index": i, "rewards": [0.0], "lengths": [1], "extras": {}})
    v.poll(step=2)
    (record,) = logged
    assert record["val/prompts"] == 10 and record["val/complete"] == 1


def test_the_end_of_a_run_withdraws_a_validation_still_running(monkeypatch):
    v, logged, said = _validation(monkeypatch, size=3, every=1)
    v.request(1)
    v.abandon(step=5)
    assert not v.holding and v.queue.finished == [1] and not logged
    assert any("still running when the run ended" in s for s in said), said


def test_no_validation_set_published_is_said_not_silently_skipped(monkeypatch):
    v, _, said = _validation(monkeypatch, size=0, every=1)
    v.request(1)
    assert not v.holding and "published no validation set" in said[0]
    assert not v.due(1) and v.due(2)  # said once per interval, not at every sync


def test_config_refuses_validation_without_val_files_or_weight_sync():
    with pytest.raises(ConfigError, match="data.val_files"):
        load_config(["task=file", "data.train_files=[a.jsonl]", "eval.every=5"])
    with pytest.raises(ConfigError, match="learner.weight_sync=false"):
        load_config(["eval.at_end=true", "learner.weight_sync=false"])
    assert not load_config([]).eval.enabled and load_config(["eval.every=3"]).eval.enabled


@pytest.mark.parametrize("value", [-1, 65])
def test_eval_log_samples_is_bounded(value):
    want = f"eval.log_samples must be >= 0 and <= 64 (0 = none), got {value}"
    with pytest.raises(ConfigError, match=re.escape(want)):
        load_config([f"eval.log_samples={value}"])
    assert load_config([]).eval.log_samples == 3 and load_config(["eval.log_samples=0"])


# -- the actor's side --------------------------------------------------------------------------


def _texts_engine(version: int, texts: list[str], mixed: bool = False) -> ScriptedEngine:
    """Each call answers with ``texts[:n]`` as character tokens of ``version`` (``mixed``: the
    last token of each one version newer)."""

    def reply(prompt_ids: list[int], n: int) -> list[Completion]:
        out = []
        for text in texts[:n]:
            ids = [ord(c) for c in text]
            versions = [version] * len(ids)
            if mixed and versions:
                versions[-1] += 1
            out.append(Completion(ids, [-0.1] * len(ids), versions, "stop"))
        return out

    return ScriptedEngine(reply=reply, version=version)


class CharTokenizer:
    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


class ListQueue:
    def __init__(self):
        self.put_records = []

    def put(self, version, record):
        self.put_records.append((version, record))


def _actor(engine, n_samples=1):
    cfg = Config()
    cfg.eval.n_samples = n_samples
    cfg.task.reward_executor = "thread"

    class A:  # what Validator reads of an Actor
        pass

    a = A()
    a.cfg, a.engine, a.state, a.tokenizer = cfg, engine, ActorState(actor_id=0), CharTokenizer()
    a.state.version = engine.version
    a.scorer = RewardScorer(addition_reward, cfg.task, print, lambda kind: None)
    return a


def test_an_actor_validates_greedily_and_posts_one_record_per_prompt():
    source = AdditionSource(seed=0, split="eval")
    answers = [source.get(i).fields["answer"] for i in range(2)]
    engine = _texts_engine(version=6, texts=[answers[0]])
    actor, queue = _actor(engine), ListQueue()
    validator = Validator(actor, source, 2, queue)
    asyncio.run(validator.score_chunk(range(0, 1), 6))
    (version, record), = queue.put_records  # fmt: skip
    assert version == 6 and record["index"] == 0 and record["version"] == 6
    assert record["rewards"] == [1.0] and record["lengths"] == [len(answers[0])]
    assert record["errors"] == 0 and record["off_version"] == 0
    call = engine.calls[0]
    n, max_tokens, temperature = call.n, call.max_tokens, call.temperature
    assert (n, temperature) == (1, 0.0) and max_tokens == actor.cfg.sampling.max_tokens  # greedy
    assert "sample" not in record  # the request asked for no text


def test_an_actor_sends_the_text_of_the_prompts_the_request_asks_for():
    source = AdditionSource(seed=0, split="eval")
    long = "9" * 5000  # wrong, and sent whole
    engine = _texts_engine(version=3, texts=[long, "0"])
    actor, queue = _actor(engine, n_samples=2), ListQueue()
    asyncio.run(Validator(actor, source, 3, queue).score_chunk(range(0, 3), 3, samples=2))
    records = [r for _, r in queue.put_records]
    assert [r["sample"]["prompt"] for r in records[:2]] == [source.get(i).text for i in (0, 1)]
    assert records[0]["sample"]["completion"] == long  # the first of the n completions
    assert records[0]["sample"]["reward"] == records[0]["rewards"][0] == 0.0
    assert "sample" not in records[2]  # prompt 2 is past the request's samples


def test_sampled_validation_uses_eval_temperature_and_flags_off_version_tokens():
    source = AdditionSource(seed=0, split="eval")
    engine = _texts_engine(version=2, texts=["1", "22", "333"], mixed=True)
    actor, queue = _actor(engine, n_samples=3), ListQueue()
    actor.cfg.eval.temperature = 0.7
    asyncio.run(Validator(actor, source, 1, queue).score_chunk(range(1), 2))
    record = queue.put_records[0][1]
    assert len(record["rewards"]) == 3 and record["off_version"] == 3
    assert engine.calls[0].n == 3 and engine.calls[0].temperature == 0.7


def test_validation_size_caps_a_finite_set_and_sizes_the_endless_one():
    cfg = Config()

    class Finite:
        size = 10

    assert validation_size(cfg, Finite()) == 10
    cfg.eval.max_prompts = 4
    assert validation_size(cfg, Finite()) == 4 and validation_size(cfg, AdditionSource()) == 4
    cfg.eval.max_prompts = 0
    assert validation_size(cfg, AdditionSource()) == 64


class GatedEngine(ScriptedEngine):
    """Generations wait for ``gate``; ``peak`` is the most running at once."""

    weights_valid = True

    def __init__(self, version: int, fail: bool = False):
        super().__init__(reply=_texts_engine(version, texts=["0"]).reply, version=version)
        self.gate, self.running, self.peak, self.fail = asyncio.Event(), 0, 0, fail

    async def generate(self, *args):
        self.running += 1
        self.peak = max(self.peak, self.running)
        await self.gate.wait()
        self.running -= 1
        if self.fail:
            raise RuntimeError("engine died mid-validation")
        return await super().generate(*args)


class RequestQueue(ListQueue):
    """One posted request of ``size`` prompts in chunks of ``chunk`` (buffer/eval_queue.py's
    claim order)."""

    def __init__(self, version: int, size: int, chunk: int):
        super().__init__()
        self.req = {"version": version, "size": size, "chunk": chunk, "samples": 0}
        self.todo = list(range(0, size, chunk))

    def request(self):
        return self.req

    def claim(self, request):
        return (
            range(s, min(s + request["chunk"], request["size"]))
            if (s := self._pop()) is not None
            else None
        )

    def _pop(self):
        return self.todo.pop(0) if self.todo else None


def _serve(engine, queue, size: int, in_flight: int):
    """``Validator.run`` until every prompt's record is in (or it raises); the most prompts
    generating at once."""
    actor = _actor(engine)
    actor.cfg.eval.prompts_in_flight = in_flight
    validator = Validator(actor, AdditionSource(seed=0, split="eval"), size, queue)

    async def main():
        run = asyncio.create_task(validator.run())
        await asyncio.sleep(0.6)  # the validator claims what it may, then waits on the engine
        engine.gate.set()
        while len(queue.put_records) < size and not run.done():
            await asyncio.sleep(0.05)
        actor.state.stop = True
        await run

    asyncio.run(asyncio.wait_for(main(), 10))
    return engine.peak


def test_an_actor_validates_several_chunks_at_once_up_to_its_cap():
    """``eval.prompts_in_flight``: one actor keeps claiming chunks until that many prompts
    generate at once (in one engine batch), not one chunk after another."""
    engine, queue = GatedEngine(version=6), RequestQueue(6, size=12, chunk=2)
    assert _serve(engine, queue, 12, in_flight=6) == 6  # 3 chunks of 2, then the cap
    assert sorted(r["index"] for _, r in queue.put_records) == list(range(12))
    engine, queue = GatedEngine(version=6), RequestQueue(6, size=12, chunk=2)
    assert _serve(engine, queue, 12, in_flight=1) == 2  # one chunk at a time (a chunk is whole)


def test_a_failing_validation_chunk_stops_the_actor_with_its_error():
    engine, queue = GatedEngine(version=6, fail=True), RequestQueue(6, size=4, chunk=2)
    with pytest.raises(RuntimeError, match="engine died mid-validation"):
        _serve(engine, queue, 4, in_flight=4)
