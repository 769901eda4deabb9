"""``asyncrl.core.config.cores``: ``cpu_affinity: auto`` splits one host's cores between the learner and
the actors of ``asyncrl run``, never sharing one; otherwise it leaves them unpinned."""

from __future__ import annotations

import pytest

from asyncrl.core.config import cores
from asyncrl.core.config.load import load_config


@pytest.mark.parametrize(
    ("usable", "learner_n", "actor_n", "split"),
    [
        ([0, 1], 1, 1, ("0", "1")),
        ([0, 1, 2, 3], 1, 1, ("0", "1-3")),  # the actors get every core left
        ([4, 6, 7, 9], 2, 1, ("4,6", "7,9")),  # the usable set, not 0..n-1
        ([3, 1, 2, 0], 2, 2, ("0-1", "2-3")),
        ([0], 1, 1, None),  # do not fit: unpinned
        ([0, 1], 2, 1, None),
    ],
)
def test_split_cores(usable, learner_n, actor_n, split):
    assert cores.split_cores(usable, learner_n, actor_n) == split


def test_the_cpu_presets_split_two_cores():
    cfg = load_config([])
    assert (cfg.learner.cpu_affinity, cfg.actor.cpu_affinity) == ("auto", "auto")
    assert cfg.actor.cpu_bind == ""  # not "auto": resolve sets it with the actors' cores
    note = cores.resolve(cfg, [0, 1], both_sides=True)
    assert (cfg.learner.cpu_affinity, cfg.actor.cpu_affinity, cfg.actor.cpu_bind) == ("0", "1", "1")
    assert note == "cpu_affinity=auto: learner on cores 0, actors on cores 1"


def test_too_few_cores_or_one_side_leave_auto_unpinned():
    cfg = load_config([])
    note = cores.resolve(cfg, [0], both_sides=True)
    assert (cfg.learner.cpu_affinity, cfg.actor.cpu_affinity, cfg.actor.cpu_bind) == ("", "", "")
    assert "unpinned (1 usable core(s) for 1 learner + 1 actor thread(s))" in note
    cfg = load_config([])
    note = cores.resolve(cfg, [0, 1, 2, 3], both_sides=False)
    assert (cfg.learner.cpu_affinity, cfg.actor.cpu_affinity) == ("", "")
    assert "starts one side" in note


def test_explicit_choices_are_kept():
    cfg = load_config(
        ["learner.cpu_affinity=''", "actor.cpu_affinity='3'", "actor.cpu_bind=nobind"]
    )
    assert cores.resolve(cfg, [0, 1, 2, 3], both_sides=True) == ""
    assert (cfg.learner.cpu_affinity, cfg.actor.cpu_affinity, cfg.actor.cpu_bind) == (
        "",
        "3",
        "nobind",
    )
    cfg = load_config(["learner.cpu_affinity='0'"])  # the actors' auto takes what is left
    cores.resolve(cfg, [0, 1, 2], both_sides=True)
    assert (cfg.learner.cpu_affinity, cfg.actor.cpu_affinity) == ("0", "1-2")


def test_a_bad_value_is_refused():
    from asyncrl.core.config.load import ConfigError

    with pytest.raises((ConfigError, ValueError), match="a core list, '' or auto"):
        load_config(["actor.cpu_affinity=everything"])


def test_an_explicit_side_keeps_its_cores_from_the_other_sides_auto():
    cfg = load_config(["learner.cpu_affinity='2'"])
    note = cores.resolve(cfg, [0, 1, 2, 3], both_sides=True)
    assert (cfg.learner.cpu_affinity, cfg.actor.cpu_affinity, cfg.actor.cpu_bind) == (
        "2",
        "0-1,3",
        "0-1,3",
    )
    assert note == "cpu_affinity=auto: actors on cores 0-1,3"
    cfg = load_config(["actor.cpu_affinity='0-1'"])
    cores.resolve(cfg, [0, 1], both_sides=True)  # nothing left: the learner runs unpinned
    assert (cfg.learner.cpu_affinity, cfg.actor.cpu_affinity) == ("", "0-1")


def test_engine_cpus_bind_vllm_there_and_must_leave_the_actor_a_core():
    cfg = load_config(["actor.engine_cpus='3'"])  # auto: the actors get 1-3, the engine 3
    assert cfg.actor.cpu_bind == "3"  # the worker's threads on the engine's cores
    cores.resolve(cfg, [0, 1, 2, 3], both_sides=True)
    assert (cfg.actor.cpu_affinity, cfg.actor.cpu_bind) == ("1-3", "3")
    cfg = load_config(["actor.engine_cpus='1'"])  # the demo's split leaves the actors core 1
    with pytest.raises(ValueError, match=r"engine_cpus=1 must be some of the actors' cores \(1\)"):
        cores.resolve(cfg, [0, 1], both_sides=True)
    cfg = load_config(["actor.engine_cpus='5'"])
    with pytest.raises(ValueError, match="actor.engine_cpus=''"):
        cores.resolve(cfg, [0, 1, 2, 3], both_sides=True)
    cfg = load_config(["actor.engine_cpus='1'"])  # unpinned actors: checked at engine start
    cores.resolve(cfg, [0], both_sides=True)
    assert cfg.actor.cpu_affinity == ""


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["actor.engine_cpus=x"], "a core list, e.g. 1 or 2-7"),
        (["actor.engine_cpus='0-1'", "actor.cpu_affinity='0-1'"], "leave the actor's own"),
        (["actor.engine_cpus='2'", "actor.cpu_affinity='0-1'"], r"must be some of .*\(0-1\)"),
    ],
)
def test_bad_engine_cpus_are_refused_at_load(overrides, message):
    from asyncrl.core.config.load import ConfigError

    with pytest.raises((ConfigError, ValueError), match=message):
        load_config(overrides)
