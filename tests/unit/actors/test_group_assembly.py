"""Actor-side group assembly (``Actor.make_group``) with a scripted engine: one group per
prompt with ``n_samples`` whole completions, their log-probs and per-token versions, rewards
from the configured function (a failing one gives 0 and a reason), deterministic group id;
``update_mode=abort`` cuts are resubmitted, never committed truncated."""

import asyncio
import json

import pytest

from asyncrl.actors.actor import Actor
from asyncrl.actors.data.addition import AdditionSource, addition_reward
from asyncrl.actors.engine.protocol import Engine
from asyncrl.actors.engine.vllm_engine import Completion
from asyncrl.buffer.testing import UnreachableBuffer
from asyncrl.core.config.job import Config
from asyncrl.orchestration.demo.tokenizer import save_tokenizer
from tests.fakes.engines import ScriptedEngine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """The demo's character-level tokenizer (one token per character), no model."""
    path = tmp_path_factory.mktemp("model")
    save_tokenizer(path)
    (path / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    return str(path)


@pytest.fixture
def make_actor(model_dir):
    def make(engine=None, reward_fn=addition_reward, n=2) -> Actor:
        cfg = Config()
        cfg.sampling.n_samples = n
        cfg.task.reward_executor = "thread"  # calls the test's own reward_fn, not the spec's
        prompts = AdditionSource(seed=7, split="train")
        # make_group reads no buffer: one that fails any use proves it
        buffer = UnreachableBuffer(cfg.buffer.name)
        return Actor(cfg, 3, model_dir, buffer, engine or ScriptedEngine(), prompts, reward_fn)

    return make


def _completion(actor: Actor, text: str, version: int, reason="stop") -> Completion:
    ids = actor.tokenizer.encode(text)
    return Completion(ids, [-0.5] * len(ids), [version] * len(ids), reason)


def test_the_fakes_implement_the_engine_protocol():
    from asyncrl.actors.engine.sim import SimEngine
    from asyncrl.actors.engine.vllm_engine import ActorEngine

    for engine in (ScriptedEngine(), SimEngine(64, 1e5, 3.0), ActorEngine(llm=None, version=0)):
        assert isinstance(engine, Engine), type(engine).__name__


def test_group_has_every_sample_with_rewards_versions_and_a_deterministic_id(make_actor):
    actor = make_actor()
    prompt = actor.prompts.get(5)
    right = prompt.fields["answer"]
    done = [_completion(actor, right, 4), _completion(actor, "x", 3, "length")]
    actor.groups.engine = ScriptedEngine(done)
    group = asyncio.run(actor.make_group(5))
    assert group.group_id == f"{actor.cfg.task.seed}:5" and group.prompt_index == 5
    assert group.actor_id == 3
    assert [s.reward for s in group.samples] == [1.0, 0.0]
    assert [s.finish_reason for s in group.samples] == ["stop", "length"]
    first = group.samples[0]
    assert first.prompt_ids == actor.tokenizer.encode(prompt.text)
    assert first.completion_ids == actor.tokenizer.encode(right)
    assert first.behavior_logprobs == [-0.5] * len(right)
    assert first.token_versions == [4] * len(right)
    assert (group.version_min, group.version_max) == (3, 4)
    call = actor.engine.calls[0]
    n, max_tokens, temperature, seed = call.n, call.max_tokens, call.temperature, call.seed
    assert (n, max_tokens, temperature) == (2, actor.cfg.sampling.max_tokens, 1.0)
    assert seed == (actor.cfg.seed * 1_000_003 + 5) % 2**31  # reproducible per prompt


def test_a_failing_reward_gives_zero_and_a_reason_and_the_group_is_kept(make_actor):
    def broken(prompt, completion, **fields):
        raise ZeroDivisionError("boom")

    actor = make_actor(reward_fn=broken)
    actor.groups.engine = ScriptedEngine([_completion(actor, "1", 0), _completion(actor, "2", 0)])
    group = asyncio.run(actor.make_group(0))
    assert [s.reward for s in group.samples] == [0.0, 0.0]
    assert all("ZeroDivisionError: boom" in s.reward_error for s in group.samples)
    assert actor.state.reward_errors == 2


def test_abort_cut_completions_are_resubmitted_not_committed_truncated(make_actor):
    actor = make_actor()
    cut = [_completion(actor, "1", 0, "abort"), _completion(actor, "12", 0)]
    whole = [_completion(actor, "123", 1), _completion(actor, "12", 1)]
    actor.groups.engine = engine = ScriptedEngine(cut, whole)
    group = asyncio.run(actor.make_group(1))
    assert len(engine.calls) == 2, "the aborted request was not resubmitted"
    assert [s.finish_reason for s in group.samples] == ["stop", "stop"]
    assert group.samples[0].completion_ids == actor.tokenizer.encode("123")


def test_a_request_aborted_every_time_is_an_error_not_a_truncated_group(make_actor):
    actor = make_actor()
    cut = [_completion(actor, "1", 0, "abort"), _completion(actor, "2", 0)]
    actor.groups.engine = ScriptedEngine(*([cut] * 10))
    with pytest.raises(RuntimeError, match="aborted by 10 weight updates"):
        asyncio.run(actor.make_group(2))
