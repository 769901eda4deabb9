"""The launcher gives each process it starts its GPUs (``CUDA_VISIBLE_DEVICES``) and refuses a
layout before anything starts; the node's GPUs are faked, no process is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.core.config.load import load_config
from asyncrl.orchestration import cli
from asyncrl.orchestration.launch import jobs, roles, run_info
from asyncrl.orchestration.launch.launcher import Role
from asyncrl.orchestration.placement import gpus

_GPU_RUN = ["learner=gpu", "actor=gpu", "learner.nproc=2"]


@pytest.fixture
def started(monkeypatch) -> dict[str, dict]:
    """role name -> the environment ``spawn`` was given (instead of starting a process)."""
    envs: dict[str, dict] = {}

    def fake_spawn(name, cmd, env, run_dir, show, cores="", limits=None):
        envs[name] = env
        return Role(name, None, Path(run_dir) / f"{name}.log")

    monkeypatch.setattr(roles, "spawn", fake_spawn)
    return envs


def test_run_gives_torchrun_and_each_actor_their_own_gpus(started, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # the launcher's: the node's GPUs
    cfg = load_config([*_GPU_RUN, "actor.num_actors=2"])
    plan = gpus.plan_node(cfg, ("learner", "actors"))
    roles.spawn_learner(cfg, tmp_path, "model", "redis://x", plan)
    roles.spawn_actors(cfg, tmp_path, "model", "redis://x", [0, 1], plan)
    visible = {name: env["CUDA_VISIBLE_DEVICES"] for name, env in started.items()}
    assert visible == {"learner": "0,1", "actor0": "2", "actor1": "3"}


def test_launch_actors_maps_indices_through_the_launchers_visible_devices(started, tmp_path):
    tp2 = ["actor.tensor_parallel_size=2"]
    cfg = load_config([*_GPU_RUN, "actor.num_actors=2", *tp2])
    plan = gpus.plan_node(cfg, ("actors",), lambda: ("4", "5", "6", "7"))
    roles.spawn_actors(cfg, tmp_path, "model", "redis://x", [6, 7], plan)
    assert started["actor6"]["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert started["actor7"]["CUDA_VISIBLE_DEVICES"] == "6,7"


def test_a_cpu_run_leaves_the_environment_alone(started, tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cfg = load_config([])  # the CPU demo
    plan = gpus.plan_node(cfg, ("learner", "actors"), lambda: ())
    roles.spawn_learner(cfg, tmp_path, "model", "redis://x", plan)
    roles.spawn_actors(cfg, tmp_path, "model", "redis://x", [0], plan)
    assert all("CUDA_VISIBLE_DEVICES" not in env for env in started.values())


def test_the_placement_is_printed_once_and_recorded(tmp_path, capsys):
    cfg = load_config([*_GPU_RUN, "actor.num_actors=2"])
    plan = gpus.plan_node(cfg, ("learner", "actors"), lambda: ("0", "1", "2", "3"))
    run_info.announce_gpus(tmp_path, plan, [0, 1])
    assert capsys.readouterr().out == (
        "[asyncrl] placement: learner ranks 0-1 on GPUs 0,1; actor 0 on GPU 2; actor 1 on GPU 3\n"
    )
    assert '"actor1": "3"' in (tmp_path / "run.json").read_text()
    run_info.announce_gpus(tmp_path, gpus.NO_GPUS, [0])  # a CPU run: nothing said
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("command", [["run"], ["launch", "actors"]])
def test_a_refused_layout_fails_the_command_before_anything_starts(command, monkeypatch, capsys):
    def nothing_may_start(*args, **kwargs):
        raise AssertionError("the run directory was made before the layout was checked")

    monkeypatch.setattr(jobs, "prepare_run_dir", nothing_may_start)
    monkeypatch.setattr(gpus, "node_gpus", lambda: ("0", "1", "2", "3"))
    code = cli._main([*command, *_GPU_RUN, "actor.num_actors=5"])  # no signal handlers
    err = capsys.readouterr().err
    assert code == 1
    assert "asyncrl: error: actor.num_actors=5 x actor.tensor_parallel_size=1 needs 5 GPU(s)" in err
    assert "this node has 4" in err


def test_nccl_bootstrap_stays_on_loopback_unless_configured(monkeypatch):
    """NCCL picks a routable interface for its bootstrap sockets when not told: every role
    gets ``network.interface`` (``lo`` by default), and a user's own setting wins."""
    from asyncrl.orchestration.launch.roles import role_env

    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    assert role_env(load_config([]), "redis://x", 1)["NCCL_SOCKET_IFNAME"] == "lo"
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    assert role_env(load_config([]), "redis://x", 1)["NCCL_SOCKET_IFNAME"] == "ib0"
