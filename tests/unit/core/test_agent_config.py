"""``episode.agent`` and its keys (asyncrl/core/config/episode.py): defaults, what turns
episodes on, and each refusal with the key and the fix named."""

from __future__ import annotations

import pytest

from asyncrl.core.config.episode import EpisodeConfig
from asyncrl.core.config.load import ConfigError, load_config


def test_the_defaults_leave_agents_off_and_an_agent_turns_episodes_on():
    e = EpisodeConfig()
    assert (e.agent, e.agent_kwargs, e.agent_timeout_s, e.agent_export) == ("", {}, 300.0, "last")
    assert (e.agent_bind, e.agent_port, e.agent_model) == ("127.0.0.1", 0, "policy")
    assert not e.enabled and EpisodeConfig(agent="my_agents:solve").enabled
    assert EpisodeConfig(agent="a.py:Agent", agent_bind="::1", agent_export="all").enabled


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"agent": "a.py:run", "env": "e.py:Env"}, r"episode\.agent='a\.py:run' with episode\.env"),
        ({"agent": "a.py:run", "tools": ["t.py:f"]}, "an agent runs its own loop and tools"),
        ({"agent_kwargs": {"x": 1}}, "agent_kwargs=.* is set but episode.agent is not"),
        ({"agent": "a.py:run", "agent_export": "best"}, "give one of last, longest, first, all"),
        ({"agent": "a.py:run", "agent_bind": "0.0.0.0"}, "agent_bind='0.0.0.0': .* loopback"),
        ({"agent_bind": "localhost"}, r"loopback address only \(127\.0\.0\.1 or ::1\)"),
        ({"agent": "solve"}, r"episode\.agent='solve' must be 'module:Name'"),
        ({"agent": "a.py:run", "agent_model": ""}, "agent_model must be a non-empty"),
        ({"agent": "a.py:run", "agent_kwargs": {"f": print}}, "agent_kwargs must hold JSON"),
    ],
)
def test_a_bad_agent_setting_is_refused_naming_it(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EpisodeConfig(**kwargs)


def test_agent_keys_from_the_command_line():
    cfg = load_config(
        ["episode.agent=a.py:Agent", "+episode.agent_kwargs={level: 2}", "actor.engine=sim"]
    )
    assert cfg.episode.agent_kwargs == {"level": 2} and cfg.episode.enabled
    # the simulated engine serves an agent's calls as it serves groups: no refusal
    assert cfg.actor.engine == "sim"
    with pytest.raises(ConfigError, match=r"added with '\+': \+episode.agent_kwargs.NAME"):
        load_config(["episode.agent=a.py:Agent", "episode.agent_kwargs.level=2"])
    with pytest.raises(ConfigError, match="episode.agent_timeout_s must be > 0"):
        load_config(["episode.agent=a.py:Agent", "episode.agent_timeout_s=0"])
    with pytest.raises(ConfigError, match="algorithm.overlong_frac > 0"):  # an episode's rule
        load_config(["episode.agent=a.py:Agent", "algorithm.overlong_frac=0.2"])
