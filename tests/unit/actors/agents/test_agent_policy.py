"""A call's sampling settings (asyncrl/actors/agents/policy.py): each row of spec 46's
section 7, for training (``sampling.*``) and validation (greedy, or ``eval.temperature``):
what the call samples with and which asked parameters are counted as overridden."""

from __future__ import annotations

import pytest

from asyncrl.actors.agents.messages import Refused
from asyncrl.actors.agents.policy import CallPolicy
from asyncrl.core.config.sampling import SamplingConfig
from asyncrl.core.config.task import EvalConfig

S = SamplingConfig(n_samples=4, max_tokens=16, temperature=0.7, top_p=0.9, top_k=20, stop=["##"])
TRAIN = CallPolicy.train(S)
GREEDY = CallPolicy.eval(S, EvalConfig(n_samples=1))


def test_train_and_eval_policies_are_the_runs():
    assert (TRAIN.max_tokens, TRAIN.temperature) == (16, 0.7)
    assert TRAIN.options == {"top_p": 0.9, "top_k": 20, "stop": ["##"]}
    assert (GREEDY.temperature, GREEDY.options) == (0.0, {})
    sampled = CallPolicy.eval(S, EvalConfig(n_samples=4, temperature=0.6))
    assert (sampled.max_tokens, sampled.temperature, sampled.options) == (16, 0.6, {})


def test_a_plain_request_samples_as_the_run_with_nothing_counted():
    s = TRAIN.resolve({"model": "policy", "messages": []})
    assert (s.max_tokens, s.temperature, s.options, s.overrides) == (16, 0.7, TRAIN.options, {})
    # the run's own values, given explicitly, are not overrides
    same = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "n": 1, "stream": False}
    assert TRAIN.resolve(same).overrides == {}
    assert GREEDY.resolve({"temperature": 0, "top_p": 1.0, "top_k": -1}).overrides == {}


@pytest.mark.parametrize("policy", [TRAIN, GREEDY], ids=["train", "eval"])
def test_temperature_top_p_top_k_are_replaced_and_counted(policy):
    s = policy.resolve({"temperature": 1.3, "top_p": 0.5, "top_k": 3})
    assert s.overrides == {"temperature": 1.3, "top_p": 0.5, "top_k": 3}
    assert (s.temperature, s.options) == (policy.temperature, policy.options)


def test_max_tokens_is_capped_and_a_cut_counted():
    assert TRAIN.resolve({"max_tokens": 5}).max_tokens == 5
    assert TRAIN.resolve({"max_tokens": 5}).overrides == {}
    s = TRAIN.resolve({"max_tokens": 100})
    assert (s.max_tokens, s.overrides) == (16, {"max_tokens": 100})
    s = TRAIN.resolve({"max_completion_tokens": 40, "max_tokens": 9})
    assert (s.max_tokens, s.overrides) == (9, {})
    for bad in (0, -1, 2.5, True):
        with pytest.raises(Refused) as e:
            TRAIN.resolve({"max_tokens": bad})
        assert e.value.param == "max_tokens"


@pytest.mark.parametrize("policy", [TRAIN, GREEDY], ids=["train", "eval"])
def test_stop_strings_are_added_to_the_runs(policy):
    s = policy.resolve({"stop": "END"})
    assert s.options["stop"] == [*policy.options.get("stop", []), "END"]
    assert s.overrides == {"stop_added": ["END"]}
    assert policy.resolve({"stop": ["a", ""]}).options["stop"][-1:] == ["a"]
    with pytest.raises(Refused) as e:
        policy.resolve({"stop": 3})
    assert e.value.param == "stop"


def test_a_seed_is_replaced_and_counted():
    assert TRAIN.resolve({"seed": 7}).overrides == {"seed": 7}


@pytest.mark.parametrize(
    "name,value",
    [
        ("presence_penalty", 0.5),
        ("frequency_penalty", -0.2),
        ("repetition_penalty", 1.1),
        ("logit_bias", {"12": 5}),
        ("min_p", 0.1),
        ("response_format", {"type": "json_object"}),
        ("guided_regex", "[0-9]+"),
        ("tool_choice", "required"),
        ("tool_choice", {"type": "function", "function": {"name": "calculate"}}),
    ],
)
def test_distribution_changing_parameters_are_ignored_and_counted(name, value):
    s = TRAIN.resolve({name: value})
    assert s.overrides == {name: value}
    assert (s.temperature, s.options, s.max_tokens) == (0.7, TRAIN.options, 16)


def test_neutral_values_of_ignored_parameters_are_not_counted():
    neutral = {"presence_penalty": 0, "logit_bias": {}, "tool_choice": "auto", "min_p": None}
    assert TRAIN.resolve(neutral).overrides == {}
    assert TRAIN.resolve({"tool_choice": "none"}).overrides == {}


@pytest.mark.parametrize(
    "field,value", [("n", 2), ("top_logprobs", 3), ("stream_options", "include_usage")]
)
def test_n_top_logprobs_and_bad_stream_options_are_refused_naming_the_field(field, value):
    with pytest.raises(Refused) as e:
        TRAIN.resolve({field: value})
    assert e.value.param == field and field in str(e.value)


def test_stream_and_logprobs_are_served_and_change_no_setting():
    asked = {"stream": True, "stream_options": {"include_usage": True}, "logprobs": True}
    assert TRAIN.resolve(asked) == TRAIN.resolve({})


def test_a_policy_out_of_range_is_refused():
    with pytest.raises(ValueError, match="max_tokens"):
        CallPolicy(0, 1.0)
    with pytest.raises(ValueError, match="temperature"):
        CallPolicy(4, float("nan"))
