"""Every YAML under configs/ composes into a validated Config; bad input names the problem."""

import re
from pathlib import Path

import pytest

from asyncrl.actors.data import addition, tasks
from asyncrl.core.config import job as config_module
from asyncrl.core.config.job import TaskConfig
from asyncrl.core.config.load import (
    CONFIG_DIR,
    ConfigError,
    config_from_json,
    config_to_json,
    load_config,
)

GROUP_OPTIONS = sorted((p.parent.name, p.stem) for p in Path(CONFIG_DIR).glob("*/*.yaml"))
_NEEDS_VALUE = {
    ("model", "local"): ["model.path=/tmp/m"],
    ("buffer", "remote"): ["buffer.url=redis://:pw@x", "buffer.url_file="],
    ("task", "file"): ["data.train_files=[/tmp/prompts.parquet]"],
}


@pytest.mark.parametrize(
    ("group", "option"), GROUP_OPTIONS, ids=[f"{g}={o}" for g, o in GROUP_OPTIONS]
)
def test_every_yaml_composes(group, option):
    cfg = load_config([f"{group}={option}", *_NEEDS_VALUE.get((group, option), [])])
    assert cfg is not None


def test_default_is_the_cpu_demo():
    cfg = load_config()
    assert cfg.model.path == "demo"
    assert cfg.mode.name == "async"
    assert cfg.learner.nproc == 1  # one rank pinned apart from the actor
    assert (cfg.learner.cpu_affinity, cfg.actor.cpu_affinity) == ("auto", "auto")


def test_sync_mode_is_strictly_on_policy():
    cfg = load_config(["mode=sync"])
    assert cfg.mode.name == "sync" and cfg.buffer.max_staleness == 0


def test_a_pretrained_model_paces_by_window_and_sync_mode_sets_capacity_over_it(tmp_path):
    """The pretrained-model presets admit by window (measured on SmolLM2: docs/algorithms.md,
    "Admission") and keep 3 checkpoints, the demo's admits by capacity; mode=sync composes after the presets and the
    experiment, so its on-policy buffer settings win there; the command line wins over all."""
    assert load_config().buffer.admission == "capacity"
    url_file = tmp_path / "redis.url"
    url_file.write_text("redis://u:p@127.0.0.1:6379/0")
    url_file.chmod(0o600)
    for preset in (["model=local", "model.path=/m"], ["model=smollm2"]):
        for where in ([], ["buffer=remote", f"buffer.url_file={url_file}"], ["layout=gpu1"]):
            cfg = load_config([*preset, *where])
            assert (cfg.mode.name, cfg.buffer.admission) == ("async", "window"), (preset, where)
            assert cfg.learner.keep_checkpoints == 3, (preset, where)  # GBs each
        sync = load_config([*preset, "mode=sync"])
        assert (sync.buffer.admission, sync.buffer.max_staleness) == ("capacity", 0)
        assert load_config([*preset, "buffer.admission=capacity"]).buffer.admission == "capacity"
    assert load_config(["experiment=smollm2_math"]).buffer.admission == "window"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["learner.nope=1"], "learner.nope"),
        (["+learner.nope=1"], "learner.nope"),
        (["learner.lr=-1"], "learner.lr must be > 0"),
        (["learner.lr=1e30"], "learner.lr must be > 0 and <= 1 (AdamW moves each weight"),
        (["algorithm=nope"], "algorithm=nope: no such algorithm preset (options: dapo,"),
        (
            ["experiment=nonexistent"],
            "no such experiment preset (options: chain, smollm2_agent, smollm2_math",
        ),
        (["model=smolm2"], "did you mean 'smollm2'?"),
        (["learner.stpes=10"], "unknown config key 'learner.stpes'; did you mean 'learner.steps'"),
        (["mode=sync", "buffer.max_staleness=2"], "mode=sync requires"),
        (["buffer.admission=fifo"], "buffer.admission='fifo': give one of capacity, window"),
        (["mode=sync", "buffer.admission=window"], "buffer.admission=window is for mode=async"),
        (["sampling.n_samples=1"], "sampling.n_samples"),
        (["algorithm.policy_loss=foo"], "algorithm.policy_loss"),
        (["buffer.capacity=zero"], "buffer.capacity"),
        (["buffer.capacity=-1"], "buffer.capacity"),
        (["learner.nproc=2", "learner.batch_groups=3", "sampling.n_samples=3"], "split evenly"),
        (["learner.sync_every=3", "buffer.max_staleness=1"], "learner.sync_every <= buffer"),
        (["mode=sync", "learner.sync_every=2"], "learner.sync_every=2 with"),
        (["model.attn_implementation=flash_attention_2"], "flash_attention_2 needs a CUDA"),
        (["learner.restart_max=-1"], "learner.restart_max must be >= 0"),
        # Hydra's raw words (ANTLR's LexerNoViableAltException, "mismatched input") before
        (["run_dir=/tmp/ü"], "the override 'run_dir=/tmp/ü' cannot be parsed (token recognition"),
        (["run_dir=/tmp/a(b"], "quote the value for Hydra: run_dir='/tmp/a(b' (in a shell"),
        (["run_dir=/tmp/a=b"], "the override 'run_dir=/tmp/a=b' cannot be parsed"),
        (["run_dir=/tmp/a,b"], "has a comma, which Hydra reads as a sweep"),
        (["~learner.steps"], "deletes a key, and every key of the schema must have a value"),
    ],
)
def test_bad_config_names_the_problem(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(overrides)


def test_a_users_own_presets_are_listed_and_a_missing_package_header_is_named(tmp_path):
    """Issue 43 round 4: a user's experiment file without '# @package _global_' got "did you
    mean experiment_name?", and a misspelt name of the user's own preset listed only ours."""
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text("learner:\n  steps: 7\n")
    (tmp_path / "experiment" / "good.yaml").write_text(
        "# @package _global_\nlearner:\n  steps: 9\n"
    )
    search = f"hydra.searchpath=[file://{tmp_path}]"
    assert load_config([search, "experiment=good"]).learner.steps == 9
    with pytest.raises(ConfigError, match=r"the experiment preset put its keys under "
                       r"'experiment\.' .* must start with the line '# @package _global_'"):  # fmt: skip
        load_config([search, "experiment=mine"])
    with pytest.raises(ConfigError) as e:
        load_config([search, "experiment=goood"])
    assert "did you mean 'good'?" in str(e.value) and f"{tmp_path}/experiment/" in str(e.value)
    with pytest.raises(ConfigError, match="unknown config key 'experiment.x'"):  # typed: a typo
        load_config(["experiment.x=1"])


def test_a_quoted_value_with_any_characters_is_taken_as_it_is():
    assert load_config(["run_dir='/tmp/ü (x)=,y'"]).run_dir == "/tmp/ü (x)=,y"


def test_values_from_the_environment_are_written_as_their_resolver_text(monkeypatch):
    """Issue 43 round 4: ${oc.env:VAR} resolved a secret into config.json and the trackers."""
    from asyncrl.core.config import env_refs
    from asyncrl.core.config.load import config_to_yaml

    monkeypatch.setenv("ASYNCRL_TEST_SECRET", "s3cr3t")
    cfg = load_config(["experiment_name=${oc.env:ASYNCRL_TEST_SECRET}",
                       "project_name=${oc.env:ASYNCRL_TEST_UNSET,fallback}"])  # fmt: skip
    assert (cfg.experiment_name, cfg.project_name) == ("s3cr3t", "fallback")
    text = config_to_json(cfg)
    assert "s3cr3t" not in text and "s3cr3t" not in config_to_yaml(cfg)
    assert '"experiment_name": "${oc.env:ASYNCRL_TEST_SECRET}"' in text
    back = config_from_json(text)  # a role resolves it from its own environment
    assert back.experiment_name == "s3cr3t" and config_to_json(back) == text
    assert env_refs.written(back)["experiment_name"] == "${oc.env:ASYNCRL_TEST_SECRET}"
    monkeypatch.setenv("ASYNCRL_TEST_URL", "redis://u:s3cr3t@127.0.0.1:6379/0")
    remote = load_config(["buffer=remote", "buffer.url=${oc.env:ASYNCRL_TEST_URL}"])
    assert remote.buffer.url.startswith("redis://u:s3cr3t@")
    assert '"url": "${oc.env:ASYNCRL_TEST_URL}"' in config_to_json(remote)


def test_json_round_trip():
    cfg = load_config(["learner.steps=7", "mode=sync"])
    back = config_from_json(config_to_json(cfg))
    assert back == cfg


def test_task_names_match_the_prompt_sources():
    """config._TASKS repeats actors/data/tasks.py's TASKS registry without importing it."""
    sources = tasks.TASKS
    assert set(config_module._TASKS) == set(sources)
    assert re.fullmatch(r"\d+\+\d+=", sources["addition"](load_config()).get(0).text)
    assert TaskConfig().name in sources and TaskConfig().reward_fn == addition.REWARD_SPEC


def test_a_reward_of_yours_on_the_demo_task_runs_isolated_unless_asked_otherwise():
    """Formerly, task.reward_fn on the addition task kept the inline executor (no timeout, and
    os._exit in the reward killed the actor); auto now means inline for the built-in only."""
    from asyncrl.orchestration.models.advice import model_warnings

    assert load_config([]).task.reward_executor == "inline"
    assert load_config(["task.reward_fn=my.py:f"]).task.reward_executor == "process"
    asked = load_config(["task.reward_fn=my.py:f", "task.reward_executor=inline"])
    assert asked.task.reward_executor == "inline"
    (warning,) = model_warnings(asked)
    assert "task.reward_timeout_s=60 is not applied" in warning and "kills the actor" in warning
    assert model_warnings(load_config([])) == []


def test_a_reward_spec_of_the_old_top_level_packages_names_the_new_path():
    with pytest.raises(ConfigError, match=re.escape("write 'asyncrl.actors.rewards:math_reward'")):
        load_config(["task.reward_fn=actors.rewards:math_reward"])
    assert load_config(["task.reward_fn=asyncrl.actors.rewards:math_reward"]).task.reward_fn
    assert load_config(["task.reward_fn=actors_of_mine.rewards:f"]).task.reward_fn
    assert load_config(["task.reward_fn=learner.py:f"]).task.reward_fn  # a file of yours


def test_a_reward_spec_of_the_flat_layout_names_where_the_module_is_now():
    want = "that module moved; write 'asyncrl.actors.data.addition:addition_reward'"
    with pytest.raises(ConfigError, match=re.escape(want)):
        load_config(["task.reward_fn=asyncrl.actors.addition:addition_reward"])
    want = "write 'asyncrl.actors.rewards.math_reward:math_reward'"
    with pytest.raises(ConfigError, match=re.escape(want)):
        load_config(["task.reward_fn=asyncrl.actors.math_reward:math_reward"])
    assert load_config(["task.reward_fn=asyncrl.actors.data.addition:addition_reward"]).task


def test_the_smollm2_recipe_written_out_in_docs_models_is_the_preset():
    """docs/models.md's command-line form of experiment=smollm2_math sets what the preset
    sets (a key added to the preset and not to the docs fails here)."""
    text = (Path(CONFIG_DIR).parents[1] / "docs" / "models.md").read_text()
    block = text.split("python examples/smollm2_math/make_data.py /tmp/smollm2_math\n", 1)[1]
    command = block.split("```", 1)[0].replace("\\\n", " ").split()
    overrides = [w.strip("'") for w in command if "=" in w]
    written, preset = load_config(overrides), load_config(["experiment=smollm2_math"])
    for section in ("learner", "sampling", "actor", "eval", "buffer", "task", "model"):
        a, b = getattr(written, section), getattr(preset, section)
        assert a == b, f"{section}: docs/models.md writes {a}, the preset is {b}"


def test_help_lists_the_groups_and_an_unknown_key_points_at_what_lists_the_keys(capsys):
    """Issue 43 round 4: the hint pointed at an `asyncrl run --help` that listed no key."""
    from asyncrl.orchestration.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    out = capsys.readouterr().out
    assert (
        "experiment chain, smollm2_agent, smollm2_math, smollm2_math_lora, smollm2_tools, tiny"
        in out
    )
    assert "algorithm  dapo, dr_grpo, grpo" in out and "asyncrl run --cfg" in out
    with pytest.raises(ConfigError) as e:
        load_config(["learner.stpes=3"])
    assert "`asyncrl run --cfg` prints every key with its value" in str(e.value)


def test_the_smollm2_lora_preset_is_smollm2_math_with_rank_8_adapters_and_their_rate():
    lora, full = (
        load_config(["experiment=smollm2_math_lora"]),
        load_config(["experiment=smollm2_math"]),
    )
    assert (lora.model.lora.rank, lora.model.lora.sync, lora.learner.lr) == (8, "adapter", 3e-4)
    assert full.model.lora.rank == 0 and full.learner.lr == 1e-5  # the model preset's rate
    lora.model.lora, lora.learner.lr = full.model.lora, full.learner.lr
    assert lora == full  # nothing else differs
