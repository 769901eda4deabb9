"""What Slurm says about the job and the step a launch runs in, read from its variables and
checked against each other (pure: the environment is a mapping passed in).

    SLURM_JOB_ID            the job                      -> SlurmJob.job_id
    SLURM_JOB_NODELIST      the job's nodes (compressed) -> SlurmJob.nodes
    SLURM_JOB_NUM_NODES     their count (checked)
    SLURMD_NODENAME         this node's name; unset off the job's nodes (an salloc shell)
    SLURM_STEP_NODELIST     the step's nodes (srun)      -> Step.nodes
    SLURM_STEP_NUM_NODES    their count (checked; SLURM_NNODES when unset)
    SLURM_NODEID            this node's index in the step -> Step.node_id
    SLURM_STEP_NUM_TASKS    the step's tasks (SLURM_NTASKS when unset) -> Step.tasks

``ASYNCRL_SLURM=0`` turns the detection off (``read`` returns None, as outside Slurm).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from asyncrl.orchestration.slurm.hostlist import expand

OFF_SWITCH = "ASYNCRL_SLURM"
"""``0``: ignore Slurm's variables; ``1`` or unset: use them (docs/multinode.md)."""

_WAY_OUT = (
    f"run the launch with srun inside the job, or set {OFF_SWITCH}=0 to ignore Slurm's "
    "variables and give the keys yourself"
)


class SlurmError(ValueError):
    """Slurm's variables cannot be read, contradict each other, or describe a step a launch
    cannot run in; the message names the variables and the fix."""


@dataclass(frozen=True)
class Step:
    """The job step (``srun``) this process is a task of."""

    nodes: tuple[str, ...]
    """The step's nodes in Slurm's order: node ``i`` of the step is ``nodes[i]``."""
    node_id: int
    """This node's index in ``nodes`` (``SLURM_NODEID``)."""
    tasks: int
    """Tasks of the step over all its nodes."""


@dataclass(frozen=True)
class SlurmJob:
    """The Slurm job this process runs in."""

    job_id: str
    """``SLURM_JOB_ID``: digits."""
    nodes: tuple[str, ...]
    """The job's nodes (``SLURM_JOB_NODELIST``, expanded)."""
    node_name: str
    """This node's Slurm name (``SLURMD_NODENAME``); '' when this process is not on a node
    of the job (an ``salloc`` shell on a login node)."""
    step: Step | None
    """The step, or None outside one (the batch script itself, an ``salloc`` shell)."""


def read(env: Mapping[str, str]) -> SlurmJob | None:
    """The job ``env`` describes; None outside Slurm or with ``ASYNCRL_SLURM=0``. Raises
    ``SlurmError`` naming the variable when the variables cannot be read or disagree."""
    switch = env.get(OFF_SWITCH, "1")
    if switch not in ("0", "1", ""):
        raise SlurmError(
            f"{OFF_SWITCH}={switch!r}: give 0 (ignore Slurm's variables) or 1 (use them, the "
            "default)"
        )
    job_id = env.get("SLURM_JOB_ID", "")
    if switch == "0" or not job_id:
        return None
    if not job_id.isdigit():
        raise SlurmError(f"SLURM_JOB_ID={job_id!r} is not a job id (digits); {_WAY_OUT}")
    nodes = _nodelist(env, "SLURM_JOB_NODELIST")
    _check_count(env, "SLURM_JOB_NUM_NODES", "SLURM_JOB_NODELIST", len(nodes))
    step = _step(env) if env.get("SLURM_STEP_NODELIST") else None
    return SlurmJob(job_id, tuple(nodes), env.get("SLURMD_NODENAME", ""), step)


def _step(env: Mapping[str, str]) -> Step:
    nodes = _nodelist(env, "SLURM_STEP_NODELIST")
    count_var = "SLURM_STEP_NUM_NODES" if "SLURM_STEP_NUM_NODES" in env else "SLURM_NNODES"
    _check_count(env, count_var, "SLURM_STEP_NODELIST", len(nodes))
    node_id = _integer(env, "SLURM_NODEID")
    if not 0 <= node_id < len(nodes):
        raise SlurmError(
            f"SLURM_NODEID={node_id} is not below the step's {len(nodes)} node(s) "
            f"(SLURM_STEP_NODELIST={env['SLURM_STEP_NODELIST']}): this node's index in the step "
            f"must be 0 .. {len(nodes) - 1}; were the variables set by hand or inherited from "
            f"another step? {_WAY_OUT}"
        )
    tasks_var = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    tasks = _optional_integer(env, tasks_var)
    return Step(tuple(nodes), node_id, len(nodes) if tasks is None else tasks)


def _nodelist(env: Mapping[str, str], var: str) -> list[str]:
    text = env.get(var, "")
    if not text:
        raise SlurmError(f"SLURM_JOB_ID is set but {var} is not; {_WAY_OUT}")
    try:
        return expand(text)
    except ValueError as e:
        raise SlurmError(f"{var}={text!r} is not a Slurm host list ({e}); {_WAY_OUT}") from None


def _check_count(env: Mapping[str, str], var: str, list_var: str, listed: int) -> None:
    count = _optional_integer(env, var)
    if count is not None and count != listed:
        raise SlurmError(
            f"{var}={count} but {list_var}={env[list_var]!r} names {listed} node(s): Slurm's "
            f"variables disagree; {_WAY_OUT}"
        )


def _integer(env: Mapping[str, str], var: str) -> int:
    text = env.get(var)
    if text is None or not text.isdigit():
        got = "unset" if text is None else f"{text!r}"
        raise SlurmError(f"{var} is {got}, expected a number inside a Slurm job step; {_WAY_OUT}")
    return int(text)


def _optional_integer(env: Mapping[str, str], var: str) -> int | None:
    return _integer(env, var) if var in env else None
