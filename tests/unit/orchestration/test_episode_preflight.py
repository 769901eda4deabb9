"""``asyncrl run`` checks ``episode.env`` and ``episode.tools`` (or ``episode.agent``) before
any process starts: a wrong name, a class without ``step``, a tool without a schema or an
agent of the wrong signature fails naming the key."""

from __future__ import annotations

import pytest

from asyncrl.actors.episodes.tool_calls import PARSERS
from asyncrl.core.config.episode import TOOL_PARSERS
from asyncrl.core.config.load import load_config
from asyncrl.orchestration.launch.preflight import check_episode


def test_the_configs_parser_names_are_the_parsers():
    assert sorted(TOOL_PARSERS) == sorted(PARSERS)


def test_the_demo_environment_passes():
    check_episode(load_config(["experiment=chain"]))
    check_episode(load_config([]))  # no episodes: nothing to check


@pytest.mark.parametrize(
    "body, key, message",
    [
        ("class Env:\n    def reset(self, row): return 'hi'\n", "env", "has no step method"),
        ("Env = 3\n", "env", "not a class"),
        ("def tool(x):\n    return x\n", "tools", "type hints"),
    ],
)
def test_a_bad_environment_or_tool_is_refused_naming_the_key(tmp_path, body, key, message):
    path = tmp_path / "mine.py"
    path.write_text(body)
    name = "Env" if key == "env" else "tool"
    value = f"{path}:{name}" if key == "env" else f"[{path}:{name}]"
    cfg = load_config([f"episode.{key}={value}"])
    with pytest.raises(ValueError, match=rf"^episode\.{key}: .*{message}"):
        check_episode(cfg)


def test_a_missing_module_is_refused_naming_the_key():
    cfg = load_config(["episode.env=no_such_module_anywhere:Env"])
    with pytest.raises(ValueError, match=r"^episode\.env: .*cannot import module"):
        check_episode(cfg)


def test_env_kwargs_are_checked_against_the_constructor_before_anything_starts(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(
        "class Env:\n    def __init__(self, level: int): self.level = level\n"
        "    def reset(self, row): return 'hi'\n    def step(self, m): return [], 1.0, True, {}\n"
    )
    check_episode(load_config([f"episode.env={path}:Env", "+episode.env_kwargs.level=2"]))
    with pytest.raises(ValueError, match=r"^episode\.env: .*missing a required argument"):
        check_episode(load_config([f"episode.env={path}:Env"]))


def test_env_kwargs_need_an_env_and_a_plus_to_add_keys():
    from asyncrl.core.config.load import ConfigError

    with pytest.raises(ConfigError, match="episode.env_kwargs=.* is set but episode.env is not"):
        load_config(["+episode.env_kwargs.level=2"])
    with pytest.raises(ConfigError, match=r"added with '\+': \+episode.env_kwargs.NAME=VALUE"):
        load_config(["experiment=chain", "episode.env_kwargs.level=2"])
    cfg = load_config(["experiment=chain", "+episode.env_kwargs={level: 2, names: [a, b]}"])
    assert cfg.episode.env_kwargs == {"level": 2, "names": ["a", "b"]}


def test_an_agent_is_loaded_before_anything_starts(tmp_path):
    from tests.fakes.agents import spec_of

    check_episode(load_config([f"episode.agent={spec_of('returns_float')}"]))
    check_episode(
        load_config([f"episode.agent={spec_of('Counter')}", "+episode.agent_kwargs.start=2"])
    )
    path = tmp_path / "mine.py"
    path.write_text("async def solve(row):\n    return 1.0\n")
    with pytest.raises(ValueError, match=r"^episode\.agent: .*does not take base_url and api_key"):
        check_episode(load_config([f"episode.agent={path}:solve"]))
    with pytest.raises(ValueError, match=r"^episode\.agent: .*cannot take episode.agent_kwargs"):
        check_episode(
            load_config([f"episode.agent={spec_of('Counter')}", "+episode.agent_kwargs.stop=1"])
        )
