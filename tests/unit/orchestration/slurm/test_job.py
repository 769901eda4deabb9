"""Slurm's variables read into one record, and refused, naming the variable and the fix, when
they cannot be read or disagree (the environment is a dict: no Slurm needed)."""

from __future__ import annotations

import pytest

from asyncrl.orchestration.slurm.job import SlurmError, SlurmJob, Step, read

JOB = {"SLURM_JOB_ID": "1234", "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_JOB_NUM_NODES": "4"}
STEP = {
    **JOB,
    "SLURMD_NODENAME": "n2",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_NODEID": "1",
    "SLURM_PROCID": "1",
}


def test_a_task_of_a_step_reads_the_job_the_step_and_this_node():
    assert read(STEP) == SlurmJob(
        job_id="1234",
        nodes=("n1", "n2", "n3", "n4"),
        node_name="n2",
        step=Step(nodes=("n1", "n2"), node_id=1, tasks=2),
    )


def test_the_batch_script_is_in_the_job_but_in_no_step():
    job = read({**JOB, "SLURMD_NODENAME": "n1"})
    assert job is not None and job.step is None and job.node_name == "n1"


def test_the_older_names_stand_in_for_the_step_counts():
    env = {k: v for k, v in STEP.items() if not k.startswith("SLURM_STEP_NUM")}
    job = read({**env, "SLURM_NNODES": "2", "SLURM_NTASKS": "4"})
    assert job is not None and job.step == Step(nodes=("n1", "n2"), node_id=1, tasks=4)


def test_outside_slurm_and_with_the_off_switch_there_is_no_job():
    assert read({}) is None
    assert read({"ASYNCRL_SLURM": "0", **STEP}) is None
    assert read({"ASYNCRL_SLURM": "1", **STEP}) == read(STEP)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"ASYNCRL_SLURM": "no"}, "ASYNCRL_SLURM='no': give 0 (ignore Slurm's variables) or 1"),
        ({"SLURM_JOB_ID": "12a"}, "SLURM_JOB_ID='12a' is not a job id"),
        ({"SLURM_JOB_NODELIST": "n[1-4"}, "SLURM_JOB_NODELIST='n[1-4' is not a Slurm host list"),
        ({"SLURM_JOB_NODELIST": ""}, "SLURM_JOB_ID is set but SLURM_JOB_NODELIST is not"),
        ({"SLURM_JOB_NUM_NODES": "3"}, "SLURM_JOB_NUM_NODES=3 but SLURM_JOB_NODELIST='n[1-4]' names 4"),
        ({"SLURM_STEP_NODELIST": "n[2-1]"}, "SLURM_STEP_NODELIST='n[2-1]' is not a Slurm host list"),
        ({"SLURM_STEP_NUM_NODES": "3"}, "SLURM_STEP_NUM_NODES=3 but SLURM_STEP_NODELIST='n[1-2]' names 2"),
        ({"SLURM_NODEID": "2"}, "SLURM_NODEID=2 is not below the step's 2 node(s)"),
        ({"SLURM_NODEID": "x"}, "SLURM_NODEID is 'x', expected a number"),
        ({"SLURM_NODEID": None}, "SLURM_NODEID is unset, expected a number"),
        ({"SLURM_STEP_NUM_TASKS": "two"}, "SLURM_STEP_NUM_TASKS is 'two', expected a number"),
    ],
)  # fmt: skip
def test_variables_that_cannot_be_used_are_refused_naming_them_and_the_fix(change, says):
    env = {**STEP, **change}
    env = {k: v for k, v in env.items() if v is not None}
    with pytest.raises(SlurmError) as e:
        read(env)
    assert says in str(e.value)
    if "ASYNCRL_SLURM" not in change:
        assert "set ASYNCRL_SLURM=0 to ignore Slurm's variables" in str(e.value)
