"""The demo addition task: deterministic prompts, disjoint splits, long-tailed answers, reward."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from asyncrl.actors.data.addition import REWARD_SPEC, AdditionSource, addition_reward


def test_same_seed_and_index_give_the_same_prompt():
    a, b = AdditionSource(seed=3), AdditionSource(seed=3)
    assert [a.get(i) for i in range(50)] == [b.get(i) for i in reversed(range(50))][::-1]
    assert a.get(7) == a.get(7)
    assert [p.text for p in AdditionSource(seed=4).batch(0, 50)] != [p.text for p in a.batch(0, 50)]


def test_cursor_advances_and_resumes():
    src = AdditionSource(seed=1)
    first = [src.next() for _ in range(5)]
    assert [p.index for p in first] == [0, 1, 2, 3, 4]
    assert src.cursor == 5
    resumed = AdditionSource(seed=1, start=3)
    assert resumed.next() == first[3]


def test_prompt_fields_are_consistent():
    for p in AdditionSource(seed=0).batch(0, 200):
        a, b = p.fields["a"], p.fields["b"]
        assert p.text == f"{a}+{b}="
        assert p.fields["answer"] == str(a + b)


def test_train_and_eval_splits_are_disjoint():
    def problems(split, seed):
        return {
            frozenset((p.fields["a"], p.fields["b"]))
            for p in AdditionSource(seed=seed, split=split).batch(0, 3000)
        }

    train = problems("train", 0) | problems("train", 1)
    held_out = problems("eval", 0) | problems("eval", 1)
    assert len(held_out) > 500
    assert not train & held_out


def test_answer_lengths_vary_with_a_long_tail():
    lengths = Counter(len(p.fields["answer"]) for p in AdditionSource(seed=0).batch(0, 4000))
    assert set(lengths) >= {1, 2, 3, 4, 5}
    # Skewed: the mode is 2 digits, then every extra digit is rarer (a long tail).
    assert lengths.most_common(1)[0][0] == 2
    assert lengths[2] > lengths[3] > lengths[4] > lengths[5] > 0
    assert lengths[4] + lengths[5] + lengths[6] < 0.25 * 4000


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="split"):
        AdditionSource(split="test")
    with pytest.raises(ValueError, match="index"):
        AdditionSource().get(-1)
    with pytest.raises(ValueError, match="digit_weights"):
        AdditionSource(digit_weights=(0.0, 0.0))


def test_reward_spec_names_the_addition_reward():
    assert REWARD_SPEC == "asyncrl.actors.data.addition:addition_reward"


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("168", 1.0),  # exact
        (" 168\n", 1.0),  # surrounding whitespace ignored
        ("178", 2 / 3),  # tens digit wrong: 2 of 3 digits right
        ("68", 2 / 3),  # too short: 2 of max(2, 3) digits right
        ("1168", 3 / 4),  # too long: 3 right-aligned digits of 4
        ("186", 1 / 3),  # digits compared aligned on the right: only the hundreds match
        ("999", 0.0),  # all digits wrong
        ("", 0.0),  # empty
        ("abc", 0.0),  # garbage
        ("168+1", 0.0),  # trailing garbage (e.g. ran into max_tokens)
    ],
)
def test_addition_reward_values(completion, expected):
    got = addition_reward("123+45=", completion, answer="168", a=123, b=45)
    assert got == pytest.approx(expected, abs=1e-12)


def test_addition_reward_parses_the_prompt_without_answer_field():
    assert addition_reward("7+5=", "12") == 1.0
    assert addition_reward("7+5=", "13") == pytest.approx(1 / 2)


def test_the_demo_model_is_warm_started_on_the_own_task_examples_chat_question():
    """examples/own_task asks the demo model's chat SFT question, through its chat template, so
    the example starts where the demo does (a real instruct model knows its template)."""
    import importlib.util

    from asyncrl.orchestration.demo.tokenizer import build_tokenizer
    from asyncrl.orchestration.demo.warmstart import CHAT_QUESTION, chat_text

    path = Path(__file__).resolve().parents[3] / "examples/own_task/make_data.py"
    spec = importlib.util.spec_from_file_location("make_data", path)
    make_data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_data)
    assert make_data.QUESTION == CHAT_QUESTION
    prompt = AdditionSource(seed=0).get(0)
    a, b = prompt.fields["a"], prompt.fields["b"]
    assert chat_text(build_tokenizer(), prompt) == (
        f"user: what is {a}+{b}? answer with the number only.\nassistant: "
    )


def test_the_multi_turn_warm_start_holds_a_chain_token_for_token_as_an_episode_does():
    """``model.sft_chat_turns=2`` trains on what ``experiment=chain``'s episodes hold: the same
    questions (ChainAddition) and the same template tokens between turns (the episode runner
    with a model that answers every sum right), the answers and their EOS labelled."""
    import asyncio

    from asyncrl.actors.data.chain import ChainAddition
    from asyncrl.actors.engine.vllm_engine import Completion
    from asyncrl.actors.episodes.env import StepResult
    from asyncrl.actors.episodes.render import ChatRenderer
    from asyncrl.actors.episodes.runner import Limits, Turn, run_episode
    from asyncrl.actors.episodes.tool_calls import get_parser
    from asyncrl.orchestration.demo.tokenizer import build_tokenizer
    from asyncrl.orchestration.demo.warmstart import chain_example

    tok = build_tokenizer()
    renderer = ChatRenderer(tok)

    class Host:  # ChainAddition in process (the runner's EnvHost)
        async def open(self, episode_id, row):
            self.env = ChainAddition()
            return self.env.reset(row), []

        async def step(self, episode_id, message):
            return StepResult(*self.env.step(message))

        async def close(self, episode_id):
            pass

    async def right(ids, max_tokens, seed):  # answers the last question's sum
        question = tok.decode(ids).rsplit("what is ", 1)[1].split("?")[0]
        out = tok.encode(str(sum(map(int, question.split("+"))))) + [tok.eos_token_id]
        return Completion(out, [0.0] * len(out), [0] * len(out), "stop")

    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    turn = Turn(right, decode, lambda schemas: renderer, get_parser("hermes"))
    for i in range(5):
        prompt = AdditionSource(seed=0).get(i)
        e = asyncio.run(run_episode(Host(), turn, Limits(2, 96, 8, 80), "e", prompt.fields, 0))
        assert e.end == "done" and e.reward == 1.0
        ids, labels = chain_example(tok, renderer, prompt, 2)
        assert ids == e.trajectory.prompt_ids + e.trajectory.ids
        trained = [t for t, m in zip(e.trajectory.ids, e.trajectory.mask, strict=True) if m]
        assert [t for t in labels if t != -100] == trained


def test_the_chain_scores_partial_credit_per_turn_unless_told_not_to():
    from asyncrl.actors.data.chain import ChainAddition, chain_pairs

    (a, b), (c, d) = chain_pairs(658, 6, 2)
    for partial, expected in [(True, 2 / 3), (False, 0.0)]:
        env = ChainAddition(partial_credit=partial)
        env.reset({"a": a, "b": b})
        _, first, done, _ = env.step({"content": str(a + b)[1:]})  # "64" for 664: units right
        assert not done and first == pytest.approx(expected / 2)
        _, second, done, info = env.step({"content": str(c + d)})
        assert done and second == 0.5 and info == {"exact": 1.0}
