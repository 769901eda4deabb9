"""Values their type accepts that cannot do what they are for (issue 43 round 4): each is
refused or warned naming the key, and a non-finite step names the settings that can cause it.

- ``sampling.temperature=1e-30`` failed after three non-finite steps without naming the key,
  ``1e6`` trained on noise: now refused outside 0.01 .. 10 (and ``eval.temperature``);
- ``learner.lr=1e-30`` trained silently: warned;
- ``data.max_prompt_length=1`` on the addition task shrank vLLM's context to 9 tokens and cut
  94% of the completions silently: refused, naming the prompts' length.
"""

from __future__ import annotations

import json

import pytest

from asyncrl.actors.data.datafile import DataError
from asyncrl.actors.data.tasks import build_prompt_source, check_generated_lengths
from asyncrl.core.config.load import ConfigError, load_config
from asyncrl.learner.trainer import nonfinite_suspects
from asyncrl.orchestration.demo.tokenizer import save_tokenizer
from asyncrl.orchestration.models.advice import model_warnings


@pytest.mark.parametrize("value", ["1e-30", "0.001", "1e6", "11"])
@pytest.mark.parametrize("key", ["sampling.temperature", "eval.temperature"])
def test_temperatures_that_overflow_or_sample_noise_are_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=rf"{key} must be >= 0.01 and <= 10"):
        load_config([f"{key}={value}"])


def test_a_learning_rate_too_small_to_change_a_weight_is_warned_for_any_model():
    warned = model_warnings(load_config(["learner.lr=1e-30"]))  # the demo model too
    assert any(w.startswith("learner.lr=1e-30 is too small to change the weights") for w in warned)
    assert not any("learner.lr" in w for w in model_warnings(load_config([])))


def test_a_generated_tasks_prompts_longer_than_max_prompt_length_are_refused(tmp_path):
    save_tokenizer(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    cfg = load_config(["data.max_prompt_length=1"])
    source = build_prompt_source(cfg, str(tmp_path))
    with pytest.raises(DataError) as e:
        check_generated_lengths(cfg, str(tmp_path), source)
    text = str(e.value)
    assert text.startswith("data.max_prompt_length=1 is shorter than task=addition's prompts")
    assert "completions would be cut; raise data.max_prompt_length to at least" in text
    check_generated_lengths(load_config([]), str(tmp_path), source)  # the default fits


def test_a_non_finite_step_names_the_settings_that_can_cause_it():
    text = nonfinite_suspects(load_config(["sampling.temperature=0.05", "learner.lr=3e-4"]))
    assert "learner.lr=0.0003" in text and "sampling.temperature=0.05" in text
    assert "learner.grad_clip=" in text and "model.dtype=" in text and "task.reward_fn" in text
