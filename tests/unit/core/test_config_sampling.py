"""The ``sampling`` group: one home for what the actors sample and the learner
scores; the keys it took from ``actor`` are refused naming their new place, and a run
directory written before reads with them moved."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from asyncrl.core.config.job import Config, engine_batch
from asyncrl.core.config.load import (
    CONFIG_DIR,
    MOVED_KEYS,
    ConfigError,
    config_from_json,
    config_to_json,
    load_config,
    migrate,
)


@pytest.mark.parametrize("old", sorted(MOVED_KEYS))
def test_a_moved_key_on_the_command_line_names_its_new_place(old):
    value = {"actor.stop": "['x']", "actor.top_p": "0.5", "actor.temperature": "0.5"}.get(old, "4")
    with pytest.raises(ConfigError) as refused:
        load_config([f"{old}={value}"])
    new = MOVED_KEYS[old]
    assert f"config key '{old}' moved to '{new}'" in str(refused.value)
    assert f"write {new}=... on the command line" in str(refused.value)
    load_config([f"{new}={value}"])  # the new key takes the value


def test_a_moved_key_in_a_yaml_file_names_its_new_place(tmp_path):
    configs = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, configs)
    (configs / "experiment" / "mine.yaml").write_text(
        "# @package _global_\nactor:\n  num_actors: 1\n  temperature: 0.7\n"
    )
    with pytest.raises(ConfigError, match=re.escape("'actor.temperature' moved to 'sampling.")):
        load_config(["experiment=mine"], config_dir=configs)


def test_the_presets_set_the_sampling_group():
    assert load_config().sampling.max_tokens == 8  # the demo's answers
    assert load_config(["model=smollm2"]).sampling.max_tokens == 256
    math = load_config(["experiment=smollm2_math"]).sampling
    assert (math.n_samples, math.max_tokens, math.temperature) == (4, 128, 0.7)


def test_a_config_json_written_before_the_move_reads_with_its_keys_moved():
    cfg = load_config(["sampling.n_samples=4", "sampling.temperature=0.5", "sampling.stop=[x]"])
    raw = json.loads(config_to_json(cfg))
    raw["actor"] |= raw.pop("sampling")  # as a run of before 2026-11-29 wrote it
    assert config_from_json(json.dumps(raw)) == cfg
    both = migrate({"actor": {"top_k": 5}, "sampling": {"top_k": 7}})
    assert both == {"actor": {}, "sampling": {"top_k": 7}}  # the new place wins


def test_the_engine_batch_is_derived_from_both_groups():
    cfg = Config()
    cfg.actor.max_inflight, cfg.sampling.n_samples = 3, 5
    assert engine_batch(cfg) == 15
    cfg.actor.max_num_seqs = 7
    assert engine_batch(cfg) == 7
