"""``asyncrl run`` checks ``episode.env`` and ``episode.tools`` before any process starts: a
wrong name, a class without ``step`` or a tool without a schema fails naming the key."""

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
