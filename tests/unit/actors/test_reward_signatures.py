"""The two reward signatures (ours and verl's ``compute_score``) told apart at load, verl's
adapted to ours, a dict result's numeric extras, and their per-step means."""

from __future__ import annotations

import pytest

from asyncrl.actors.rewards.calls import score_call
from asyncrl.actors.rewards.loading import (
    VerlReward,
    check_signature,
    fn_name,
    is_verl_style,
    load_reward_fn,
    preflight,
)
from asyncrl.core.types import MAX_REWARD_EXTRAS, Sample
from asyncrl.learner.hub.reward_records import extras_means

DEMO = {"a": 12, "b": 30, "answer": "42"}  # the addition task's fields
DATASET = {
    "ground_truth": "7",
    "data_source": "openai/gsm8k",
    "extra_info": {"split": "train", "index": 3},
    "question": "3 + 4?",
}


def _load(tmp_path, source: str, name: str = "compute_score"):
    f = tmp_path / "my_reward.py"
    f.write_text(source)
    return load_reward_fn(f"{f}:{name}")


VERL_FORMS = {
    "positional": "def compute_score(data_source, solution_str, ground_truth, extra_info):\n",
    "defaults": "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n",
    "kwargs": "def compute_score(solution_str, ground_truth, **kwargs):\n",
    "keyword-only": "def compute_score(*, solution_str, ground_truth, **kwargs):\n",
    "extra-default": (
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, "
        "method='strict', **kwargs):\n"
    ),
}


@pytest.mark.parametrize("form", list(VERL_FORMS))
def test_verl_forms_load_wrapped_and_score_with_ours(tmp_path, form):
    body = "    return float(solution_str.strip() == str(ground_truth))\n"
    fn = _load(tmp_path, VERL_FORMS[form] + body)
    assert isinstance(fn, VerlReward)
    check_signature(fn, DATASET, "my_reward.py:compute_score")
    check_signature(fn, DEMO, "my_reward.py:compute_score")
    assert score_call(fn, "3 + 4?", " 7 ", DATASET).value == 1.0
    assert score_call(fn, "12+30=", "42", DEMO).value == 1.0  # no ground_truth: answer


@pytest.mark.parametrize(
    "source",
    [
        "def compute_score(prompt, completion, **fields):\n    return 1.0\n",
        "def compute_score(prompt, completion, ground_truth=None, data_source='', **_):\n"
        "    return 1.0\n",
        "def compute_score(*args, **kwargs):\n    return 1.0\n",
        "def compute_score(**kwargs):\n    return 1.0\n",  # refused by check_signature
    ],
    ids=["canonical", "dataset-fields-by-name", "args-kwargs", "kwargs-only"],
)
def test_without_solution_str_it_is_ours_and_loads_unwrapped(tmp_path, source):
    fn = _load(tmp_path, source)
    assert not isinstance(fn, VerlReward) and not is_verl_style(fn)


def test_the_adapter_maps_fields_by_keyword(tmp_path):
    fn = _load(
        tmp_path,
        "seen = []\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    seen.append((data_source, solution_str, ground_truth, dict(extra_info)))\n"
        "    extra_info['num_turns'] = 1  # verl's managers add keys: not to our fields\n"
        "    return 0.0\n",
    )
    seen = fn.fn.__globals__["seen"]
    fn("3 + 4?", "the answer is 7", **DATASET)
    assert seen[-1] == ("openai/gsm8k", "the answer is 7", "7", {"split": "train", "index": 3})
    assert DATASET["extra_info"] == {"split": "train", "index": 3}
    fn("12+30=", "42", **DEMO)
    assert seen[-1] == ("", "42", "42", {})
    fn("p", "c")
    assert seen[-1][:3] == ("", "c", None)


def test_the_adapter_names_the_users_function_and_keeps_its_preflight(tmp_path):
    fn = _load(
        tmp_path,
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return 0.0\n"
        "def _check():\n"
        "    raise RuntimeError('no verifier here')\n"
        "compute_score.preflight = _check\n",
    )
    assert fn_name(fn).startswith("compute_score (") and "my_reward.py:1)" in fn_name(fn)
    with pytest.raises(RuntimeError, match="no verifier here"):
        preflight(fn)


def test_solution_str_without_verls_call_is_refused_at_load(tmp_path):
    f = tmp_path / "my_reward.py"
    f.write_text("def compute_score(solution_str, ground_truth):\n    return 0.0\n")
    with pytest.raises(ValueError) as err:
        load_reward_fn(f"{f}:compute_score")
    message = str(err.value)
    assert f"reward spec '{f}:compute_score'" in message
    assert "taken as verl-style" in message and "unexpected keyword argument" in message
    assert "def compute_score(data_source, solution_str, ground_truth, extra_info=None" in message
    assert "def compute_score(prompt, completion, **fields)" in message


@pytest.mark.parametrize(
    "source",
    [
        "def compute_score(text, gt):\n    return 0.0\n",
        "def compute_score(**kwargs):\n    return 0.0\n",
        # verl's names, one misspelled: not verl-style, and ours cannot bind the fields
        "def compute_score(data_source, solution, ground_truth, extra_info=None):\n"
        "    return 0.0\n",
    ],
    ids=["two-positionals", "kwargs-only", "misspelled-verl"],
)
def test_neither_signature_is_refused_naming_both(tmp_path, source):
    fn = _load(tmp_path, source)
    with pytest.raises(ValueError) as err:
        check_signature(fn, DATASET, "my_reward.py:compute_score")
    message = str(err.value)
    assert "'my_reward.py:compute_score'" in message
    assert "called as fn(prompt, completion, **fields)" in message
    assert "compute_score(data_source, solution_str, ground_truth, extra_info)" in message
    assert "def compute_score(prompt, completion, **fields)" in message
    assert "def compute_score(data_source, solution_str, ground_truth, extra_info=None" in message


def test_dict_results_keep_numeric_extras():
    def reward(prompt, completion, **fields):
        return {"score": 0.5, "acc": True, "len": 3, "pred": "7", "nan": float("nan")}

    s = score_call(reward, "p", "c", {})
    assert (s.value, s.kind, s.extras) == (0.5, "", {"acc": 1.0, "len": 3.0})
    assert score_call(lambda p, c, **f: 0.5, "p", "c").extras == {}
    failed = score_call(lambda p, c, **f: {"score": "x", "acc": 1.0}, "p", "c")
    assert failed.kind == "wrong_type" and failed.extras == {}


def test_extras_are_capped():
    many = {f"k{i:02d}": 1.0 for i in range(MAX_REWARD_EXTRAS + 5)}
    extras = score_call(lambda p, c, **f: {"score": 1.0, **many}, "p", "c").extras
    assert list(extras) == sorted(many)[:MAX_REWARD_EXTRAS]


def _sample(extras: dict) -> Sample:
    return Sample([1], [2], [-0.1], [0], 0.0, reward_extras=extras)


def test_extras_means_average_each_key_over_the_samples_that_have_it():
    samples = [_sample({"acc": 1.0, "len": 4.0}), _sample({"acc": 0.0}), _sample({})]
    assert extras_means(samples) == {"reward/acc": 0.5, "reward/len": 4.0}
    assert extras_means([_sample({})]) == {}
