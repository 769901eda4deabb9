"""Actor-side group assembly (``Actor.make_group``) with a scripted engine: one group per
prompt with ``n_samples`` whole completions, their log-probs and per-token versions, rewards
from the configured function (a failing one gives 0 and a reason), deterministic group id;
``update_mode=abort`` cuts are resubmitted, never committed truncated."""

import asyncio

import pytest

from actors.actor import Actor, ActorState
from actors.addition import AdditionSource, addition_reward
from actors.engine import Completion
from actors.scoring import RewardScorer
from asyncrl.config import Config


class ScriptedEngine:
    """``generate`` returns the next scripted list of completions and records each call."""

    def __init__(self, *rounds: list[Completion]):
        self.rounds, self.calls = list(rounds), []

    async def generate(self, prompt_ids, n, max_tokens, temperature, seed):
        self.calls.append((list(prompt_ids), n, max_tokens, temperature, seed))
        return self.rounds.pop(0)


class CharTokenizer:
    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def _actor(engine, reward_fn=addition_reward, n=2) -> Actor:
    cfg = Config()
    cfg.actor.n_samples = n
    cfg.task.reward_executor = "thread"  # calls the test's own reward_fn, not the spec's
    actor = object.__new__(Actor)  # only what make_group uses: no Redis, no vLLM
    actor.cfg, actor.engine = cfg, engine
    actor.state = ActorState(actor_id=3)
    actor.scorer = RewardScorer(reward_fn, cfg.task, print, actor._count_reward_error)
    actor.prompts = AdditionSource(seed=7, split="train")
    actor.tokenizer = CharTokenizer()
    return actor


def _completion(text: str, version: int, reason="stop") -> Completion:
    ids = [ord(c) for c in text]
    return Completion(ids, [-0.5] * len(ids), [version] * len(ids), reason)


def test_group_has_every_sample_with_rewards_versions_and_a_deterministic_id():
    actor = _actor(None)
    prompt = actor.prompts.get(5)
    right = prompt.fields["answer"]
    actor.engine = ScriptedEngine([_completion(right, 4), _completion("x", 3, "length")])
    group = asyncio.run(actor.make_group(5))
    assert group.group_id == f"{actor.cfg.task.seed}:5" and group.prompt_index == 5
    assert group.actor_id == 3
    assert [s.reward for s in group.samples] == [1.0, 0.0]
    assert [s.finish_reason for s in group.samples] == ["stop", "length"]
    first = group.samples[0]
    assert first.prompt_ids == actor.tokenizer.encode(prompt.text)
    assert first.completion_ids == [ord(c) for c in right]
    assert first.behavior_logprobs == [-0.5] * len(right)
    assert first.token_versions == [4] * len(right)
    assert (group.version_min, group.version_max) == (3, 4)
    (ids, n, max_tokens, temperature, seed) = actor.engine.calls[0]
    assert (n, max_tokens, temperature) == (2, actor.cfg.actor.max_tokens, 1.0)
    assert seed == (actor.cfg.seed * 1_000_003 + 5) % 2**31  # reproducible per prompt


def test_a_failing_reward_gives_zero_and_a_reason_and_the_group_is_kept():
    def broken(prompt, completion, **fields):
        raise ZeroDivisionError("boom")

    engine = ScriptedEngine([_completion("1", 0), _completion("2", 0)])
    actor = _actor(engine, reward_fn=broken)
    group = asyncio.run(actor.make_group(0))
    assert [s.reward for s in group.samples] == [0.0, 0.0]
    assert all("ZeroDivisionError: boom" in s.reward_error for s in group.samples)
    assert actor.state.reward_errors == 2


def test_abort_cut_completions_are_resubmitted_not_committed_truncated():
    cut = [_completion("1", 0, "abort"), _completion("12", 0)]
    whole = [_completion("123", 1), _completion("12", 1)]
    engine = ScriptedEngine(cut, whole)
    group = asyncio.run(_actor(engine).make_group(1))
    assert len(engine.calls) == 2, "the aborted request was not resubmitted"
    assert [s.finish_reason for s in group.samples] == ["stop", "stop"]
    assert group.samples[0].completion_ids == [ord(c) for c in "123"]


def test_a_request_aborted_every_time_is_an_error_not_a_truncated_group():
    engine = ScriptedEngine(*([[_completion("1", 0, "abort"), _completion("2", 0)]] * 10))
    with pytest.raises(RuntimeError, match="aborted by 10 weight updates"):
        asyncio.run(_actor(engine).make_group(2))
