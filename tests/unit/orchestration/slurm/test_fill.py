"""What each command takes from Slurm, for the keys the user did not set; what it refuses.
The Slurm variables are a dict and host names resolve through a table: no Slurm, no DNS."""

from __future__ import annotations

import pytest

from asyncrl.core.config.load import compose, load_config
from asyncrl.orchestration import cli
from asyncrl.orchestration.slurm import fill
from asyncrl.orchestration.slurm.fill import Taken, from_environment
from asyncrl.orchestration.slurm.job import SlurmError

ADDRESSES = {"n1": ["10.0.0.1"], "n2": ["10.0.0.2"], "n3": ["10.0.0.3"], "n4": ["10.0.0.4"]}
JOB = {"SLURM_JOB_ID": "1234", "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_JOB_NUM_NODES": "4"}


def step(nodes: str, count: int, node_id: int, tasks: int | None = None, **more) -> dict:
    """The variables of a task of an srun step over ``nodes`` (of the 4-node job ``JOB``)."""
    names = {"n[1-2]": ["n1", "n2"], "n1": ["n1"], "n3": ["n3"], "n[3-4]": ["n3", "n4"]}[nodes]
    return {
        **JOB,
        "SLURMD_NODENAME": names[node_id],
        "SLURM_STEP_NODELIST": nodes,
        "SLURM_STEP_NUM_NODES": str(count),
        "SLURM_STEP_NUM_TASKS": str(count if tasks is None else tasks),
        "SLURM_NODEID": str(node_id),
        **more,
    }


def resolve(name: str) -> list[str]:
    return ADDRESSES[name]


def taken(env: dict, role: str, *overrides: str) -> Taken:
    return from_environment(env, role, list(overrides), resolve)


def test_learner_node_1_of_a_two_node_step_takes_its_rank_the_count_and_node_0s_rendezvous():
    got = taken(step("n[1-2]", 2, node_id=1), "learner")
    assert got.overrides == [
        "network.bind='10.0.0.2'",
        "learner.nnodes=2",
        "learner.node_rank=1",
        "learner.rdzv_endpoint='n1:21234'",  # 20000 + 1234 % 10000
        "buffer.name='asyncrl-1234'",
    ]
    assert got.lines == [
        "[asyncrl] from Slurm (job 1234, node 1 of 2): network.bind=10.0.0.2 (SLURMD_NODENAME "
        "n2, resolved), learner.nnodes=2 (SLURM_STEP_NUM_NODES), learner.node_rank=1 "
        "(SLURM_NODEID), learner.rdzv_endpoint=n1:21234 (first node of SLURM_STEP_NODELIST; "
        "port 20000 + SLURM_JOB_ID % 10000), buffer.name=asyncrl-1234 (SLURM_JOB_ID)"
    ]


def test_the_taken_overrides_make_a_config_that_validates():
    overrides = [*taken(step("n[1-2]", 2, node_id=0), "learner").overrides]
    cfg = load_config([*overrides, "learner.checkpoint_dir=/shared/ckpt"])
    assert (cfg.learner.nnodes, cfg.learner.node_rank) == (2, 0)
    assert cfg.learner.rdzv_endpoint == "n1:21234"
    assert (cfg.network.bind, cfg.buffer.name) == ("10.0.0.1", "asyncrl-1234")


def test_a_one_node_learner_step_needs_no_rendezvous():
    got = taken(step("n1", 1, node_id=0), "learner")
    assert got.overrides == [
        "network.bind='10.0.0.1'",  # the actors on the other nodes reach its control plane
        "learner.nnodes=1",
        "learner.node_rank=0",
        "buffer.name='asyncrl-1234'",
    ]


def test_actors_and_buffer_take_the_address_and_the_name():
    expected = ["network.bind='10.0.0.3'", "buffer.name='asyncrl-1234'"]
    assert taken(step("n[3-4]", 2, node_id=0), "actors", "actor.nnodes=2").overrides == expected
    assert taken(step("n3", 1, node_id=0), "buffer").overrides == expected


def test_status_takes_only_the_name():
    assert taken(step("n3", 1, node_id=0), "status").overrides == ["buffer.name='asyncrl-1234'"]


def test_a_one_node_job_stays_on_loopback():
    env = {**step("n1", 1, node_id=0), "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "1"}
    assert taken(env, "buffer").overrides == ["buffer.name='asyncrl-1234'"]


def test_the_batch_script_takes_the_address_but_no_step_keys():
    env = {**JOB, "SLURMD_NODENAME": "n1"}
    assert taken(env, "learner").overrides == [
        "network.bind='10.0.0.1'",
        "buffer.name='asyncrl-1234'",
    ]


def test_an_salloc_shell_off_the_jobs_nodes_takes_no_address_and_says_so():
    got = taken(dict(JOB), "buffer")
    assert got.overrides == ["buffer.name='asyncrl-1234'"]
    assert got.lines[-1] == (
        "[asyncrl] Slurm (job 1234): network.bind not taken: this process is not on a node of "
        "the job (SLURMD_NODENAME is unset: an salloc shell?)"
    )


def test_outside_slurm_with_the_off_switch_and_for_run_and_eval_nothing_is_taken():
    assert taken({}, "learner") == Taken()
    assert taken({**step("n[1-2]", 2, node_id=1), "ASYNCRL_SLURM": "0"}, "learner") == Taken()
    for command in ("run", "eval"):
        assert taken(step("n[1-2]", 2, node_id=1), command) == Taken()


def test_keys_on_the_command_line_are_the_users():
    got = taken(
        step("n[1-2]", 2, node_id=1),
        "learner",
        "buffer.name=mine",
        "network.bind=10.9.9.9",
        "learner.rdzv_endpoint=10.0.0.1:29500",
    )
    assert got.overrides == ["learner.nnodes=2", "learner.node_rank=1"]
    assert got.lines[1] == (
        "[asyncrl] not from Slurm (job 1234, node 1 of 2), as you set them: "
        "learner.rdzv_endpoint, network.bind, buffer.name (ASYNCRL_SLURM=0 ignores Slurm "
        "altogether)"
    )


def test_a_key_given_its_default_on_the_command_line_is_the_users_too():
    got = taken(step("n[1-2]", 2, node_id=1), "actors", "network.bind=127.0.0.1", "actor.nnodes=2")
    assert got.overrides == ["buffer.name='asyncrl-1234'"]


def test_keys_a_composed_config_file_sets_are_the_users(tmp_path):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text(
        "# @package _global_\nbuffer:\n  name: team-run\nnetwork:\n  bind: 10.7.7.7\n"
    )
    got = taken(
        step("n3", 1, node_id=0),
        "buffer",
        f"hydra.searchpath=[file://{tmp_path}]",
        "experiment=mine",
    )
    assert got.overrides == []
    assert "as you set them: network.bind, buffer.name" in got.lines[0]


def test_the_user_keys_compare_the_composed_config_with_the_packaged_one():
    packaged = compose([])
    mine = compose(["mode=sync", "learner.node_rank=0"])
    assert fill.user_keys(["mode=sync", "learner.node_rank=0"], mine, packaged) == {
        "learner.node_rank"  # named, though equal to its default; mode=sync sets none of KEYS
    }


def test_a_users_node_count_the_step_contradicts_is_refused():
    with pytest.raises(SlurmError) as e:
        taken(step("n1", 1, node_id=0), "learner", "learner.nnodes=2")
    assert str(e.value) == (
        "learner.nnodes=2 (yours) but this Slurm step has 1 node(s) (SLURM_STEP_NUM_NODES), so "
        "learner.node_rank and learner.rdzv_endpoint cannot come from it: run the learner as one "
        "step over all its nodes (srun -N2 --ntasks-per-node=1 asyncrl launch learner ...), or "
        "set learner.node_rank and learner.rdzv_endpoint too"
    )


def test_one_node_steps_with_every_learner_key_given_take_none_of_them():
    given = ["learner.nnodes=2", "learner.node_rank=1", "learner.rdzv_endpoint=10.0.0.1:29500"]
    got = taken(step("n1", 1, node_id=0), "learner", *given)
    assert got.overrides == ["network.bind='10.0.0.1'", "buffer.name='asyncrl-1234'"]


def test_a_users_node_rank_other_than_the_steps_leaves_no_rendezvous_to_take():
    with pytest.raises(SlurmError) as e:
        taken(step("n[1-2]", 2, node_id=1), "learner", "learner.node_rank=0")
    assert "learner.node_rank=0 (yours) is not this node's index in the Slurm step " in str(e.value)
    assert "(SLURM_NODEID=1)" in str(e.value)


def test_several_tasks_per_node_are_refused():
    with pytest.raises(SlurmError) as e:
        taken(step("n[1-2]", 2, node_id=1, tasks=16), "learner")
    assert "this Slurm step runs 16 tasks on 2 node(s)" in str(e.value)
    assert "run it with srun --ntasks-per-node=1" in str(e.value)


def test_a_buffer_step_of_several_nodes_is_refused():
    with pytest.raises(SlurmError, match="run the buffer in a step of one node"):
        taken(step("n[3-4]", 2, node_id=0), "buffer")


def test_more_actor_nodes_than_actor_nnodes_are_refused():
    with pytest.raises(SlurmError) as e:
        taken(step("n[3-4]", 2, node_id=1), "actors")
    assert "on 2 nodes (SLURM_STEP_NUM_NODES) but actor.nnodes=1" in str(e.value)
    assert "set actor.nnodes=2" in str(e.value)


def test_a_node_name_that_resolves_to_loopback_or_not_at_all_is_refused():
    env = step("n3", 1, node_id=0)
    with pytest.raises(SlurmError) as e:
        from_environment(env, "buffer", [], lambda name: ["127.0.1.1"])
    assert "n3 (SLURMD_NODENAME) resolves to 127.0.1.1, loopback only" in str(e.value)
    assert "set network.bind=<this host's IPv4 address on the cluster network>" in str(e.value)

    def unknown(name: str) -> list[str]:
        raise OSError("Name or service not known")

    with pytest.raises(SlurmError, match=r"n3 \(SLURMD_NODENAME\) does not resolve"):
        from_environment(env, "buffer", [], unknown)
    # a bind the user gives is not resolved at all
    assert from_environment(env, "buffer", ["network.bind=10.0.0.3"], unknown).overrides == [
        "buffer.name='asyncrl-1234'"
    ]


def test_the_first_routable_address_is_taken():
    env = step("n3", 1, node_id=0)
    got = from_environment(env, "buffer", [], lambda name: ["127.0.1.1", "10.1.0.3", "10.2.0.3"])
    assert got.overrides[0] == "network.bind='10.1.0.3'"


def test_launch_prints_what_it_took_and_uses_it(monkeypatch, capsys):
    for key, value in {**step("n[1-2]", 2, node_id=1), "ASYNCRL_SLURM": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(fill, "ipv4_addresses", resolve)
    code = cli.main(["launch", "learner", "learner.checkpoint_dir=/shared/ckpt", "--cfg"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "node_rank: 1\n" in out and "rdzv_endpoint: n1:21234\n" in out
    assert err.startswith("[asyncrl] from Slurm (job 1234, node 1 of 2): network.bind=10.0.0.2")


def test_launch_refuses_bad_slurm_variables_before_anything(monkeypatch, capsys):
    for key, value in {**step("n[1-2]", 2, node_id=1), "ASYNCRL_SLURM": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SLURM_NODEID", "5")
    assert cli.main(["launch", "actors", "--cfg"]) == 2
    assert capsys.readouterr().err.startswith("asyncrl: Slurm: SLURM_NODEID=5 is not below")
