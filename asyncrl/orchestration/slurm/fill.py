"""What a launch inside a Slurm job takes from Slurm: a Hydra override for each key below that
the user did not set, and the lines that say so (docs/multinode.md, "Under Slurm").

    key                    value                                   commands
    learner.nnodes         the step's node count                   launch learner, in a step
    learner.node_rank      SLURM_NODEID                            launch learner, in a step
    learner.rdzv_endpoint  the step's first node, port             launch learner, in a step
                           20000 + SLURM_JOB_ID mod 10000          of several nodes
    network.bind           the IPv4 address SLURMD_NODENAME        launch buffer|learner|actors,
                           resolves to (not loopback)              in a job of several nodes
    buffer.name            asyncrl-<SLURM_JOB_ID>                  launch buffer|learner|actors,
                                                                   status

A key is the user's, and left alone, when an override names it or when the config the user
composed (a preset, a ``hydra.searchpath`` file) gives it another value than the packaged
defaults. ``asyncrl run`` and ``asyncrl eval`` take nothing: their roles share one machine's
loopback and, without ``buffer.url``, a private Redis of their run directory, whose keys a
resumed run must find under the same ``buffer.name`` in a later job.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from asyncrl.core.config.load import ConfigError, compose
from asyncrl.core.config.network import is_loopback
from asyncrl.orchestration.slurm.job import OFF_SWITCH, SlurmError, SlurmJob, Step, read

ROLES = ("buffer", "learner", "actors", "status")
"""What takes keys from Slurm: the three ``asyncrl launch`` roles, and ``asyncrl status``
(``buffer.name`` only, so that inside the job it finds the job's buffer)."""
KEYS = (
    "learner.nnodes",
    "learner.node_rank",
    "learner.rdzv_endpoint",
    "network.bind",
    "buffer.name",
)
RDZV_PORT_BASE = 20000
"""Learner node 0's rendezvous port is this + job id mod 10000: jobs sharing a node get other
ports (unless their ids differ by a multiple of 10000), all below Linux's ephemeral range
(32768-60999), from which outgoing connections take theirs."""


@dataclass(frozen=True)
class Taken:
    """What a launch took from Slurm."""

    overrides: list[str] = field(default_factory=list)
    """Hydra overrides (``key=value``), for keys the user did not set."""
    lines: list[str] = field(default_factory=list)
    """What was taken from where, and what was left to the user, for the console."""


@dataclass(frozen=True)
class _Value:
    key: str
    value: int | str
    source: str


Resolver = Callable[[str], list[str]]


def ipv4_addresses(name: str) -> list[str]:
    """The IPv4 addresses host ``name`` resolves to, in the resolver's order."""
    infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def from_environment(
    env: Mapping[str, str], role: str, overrides: list[str], resolve: Resolver | None = None
) -> Taken:
    """What ``role`` (``buffer``, ``learner``, ``actors``, ``status``) takes from the Slurm
    job ``env`` describes, given the user's ``overrides``; nothing outside Slurm, with
    ``ASYNCRL_SLURM=0``, or for another command. Raises ``SlurmError`` naming the variable
    and the fix when Slurm's variables cannot be used. ``resolve``: host name -> IPv4
    addresses (default ``ipv4_addresses``)."""
    if role not in ROLES:
        return Taken()
    job = read(env)
    if job is None:
        return Taken()
    try:
        mine, packaged = compose(overrides), compose([])
    except ConfigError:
        return Taken()  # the overrides do not compose: load_config says why, next
    return take(job, role, mine, user_keys(overrides, mine, packaged), resolve or ipv4_addresses)


def user_keys(overrides: list[str], mine: dict, packaged: dict) -> set[str]:
    """The ``KEYS`` the user set: named by an override, or given another value than the
    packaged default by what the overrides composed (``mine`` vs ``packaged``: both
    ``load.compose`` results)."""
    named = {o.partition("=")[0].lstrip("+~") for o in overrides}
    return {k for k in KEYS if k in named or _get(mine, k) != _get(packaged, k)}


def take(job: SlurmJob, role: str, mine: dict, user: set[str], resolve: Resolver) -> Taken:
    """The overrides and lines for ``role`` in ``job``; ``mine`` is the user's composed
    config (``load.compose``), ``user`` the keys they set (``user_keys``)."""
    values: list[_Value] = []
    notes: list[str] = []
    wanted = ["buffer.name"]
    if role != "status":
        wanted.append("network.bind")
        if job.step is not None:
            _check_step_shape(job.step, role)
        if "network.bind" not in user:
            values += _bind(job, resolve, notes)
    if role == "learner" and job.step is not None:
        wanted += ["learner.nnodes", "learner.node_rank", "learner.rdzv_endpoint"]
        values += _learner(job, job.step, mine, user)
    if role == "actors" and job.step is not None:
        _check_actor_nodes(job.step, mine)
    if "buffer.name" not in user:
        values.append(_Value("buffer.name", f"asyncrl-{job.job_id}", "SLURM_JOB_ID"))
    kept = [k for k in KEYS if k in wanted and k in user]
    return Taken([_override(v) for v in values], _lines(job, values, kept, notes))


def _bind(job: SlurmJob, resolve: Resolver, notes: list[str]) -> list[_Value]:
    """This node's address on the cluster network, when the job has several nodes (a job of
    one keeps every role on loopback): what this node's Slurm name resolves to."""
    if len(job.nodes) == 1:
        return []
    name = job.node_name
    if not name:
        notes.append(
            "network.bind not taken: this process is not on a node of the job "
            "(SLURMD_NODENAME is unset: an salloc shell?)"
        )
        return []
    fix = "set network.bind=<this host's IPv4 address on the cluster network>"
    try:
        addresses = resolve(name)
    except OSError as e:
        raise SlurmError(
            f"network.bind: this node's name {name} (SLURMD_NODENAME) does not resolve ({e}); {fix}"
        ) from None
    routable = [a for a in addresses if not is_loopback(a)]
    if not routable:
        raise SlurmError(
            f"network.bind: this node's name {name} (SLURMD_NODENAME) resolves to "
            f"{', '.join(addresses) or 'nothing'}, loopback only, which the job's other nodes "
            f"cannot reach (an /etc/hosts line such as '127.0.1.1 {name}'?); {fix}"
        )
    return [_Value("network.bind", routable[0], f"SLURMD_NODENAME {name}, resolved")]


def _learner(job: SlurmJob, step: Step, mine: dict, user: set[str]) -> list[_Value]:
    """The learner's nodes are the step's: its node count, this node's rank, and node 0's
    rendezvous. Keys the user set must agree with the step for the others to be taken."""
    n = len(step.nodes)
    nnodes = _int(mine, "learner.nnodes") if "learner.nnodes" in user else n
    rank = _int(mine, "learner.node_rank") if "learner.node_rank" in user else step.node_id
    missing = [k for k in ("learner.node_rank", "learner.rdzv_endpoint") if k not in user]
    if nnodes == 1 and "learner.rdzv_endpoint" in missing:
        missing.remove("learner.rdzv_endpoint")  # one node: torchrun stays on loopback
    if missing and nnodes != n:
        raise SlurmError(
            f"learner.nnodes={nnodes} (yours) but this Slurm step has {n} node(s) "
            f"(SLURM_STEP_NUM_NODES), so {' and '.join(missing)} cannot come from it: run the "
            f"learner as one step over all its nodes (srun -N{nnodes} --ntasks-per-node=1 "
            f"asyncrl launch learner ...), or set {' and '.join(missing)} too"
        )
    if "learner.rdzv_endpoint" in missing and rank != step.node_id:
        raise SlurmError(
            f"learner.node_rank={rank} (yours) is not this node's index in the Slurm step "
            f"(SLURM_NODEID={step.node_id}), so learner node 0 need not be the step's first "
            "node and learner.rdzv_endpoint cannot come from it: set learner.rdzv_endpoint "
            "too, or leave learner.node_rank to Slurm"
        )
    out = []
    if "learner.nnodes" not in user:
        out.append(_Value("learner.nnodes", n, "SLURM_STEP_NUM_NODES"))
    if "learner.node_rank" in missing:
        out.append(_Value("learner.node_rank", step.node_id, "SLURM_NODEID"))
    if "learner.rdzv_endpoint" in missing:
        port = RDZV_PORT_BASE + int(job.job_id) % 10000
        source = f"first node of SLURM_STEP_NODELIST; port {RDZV_PORT_BASE} + SLURM_JOB_ID % 10000"
        out.append(_Value("learner.rdzv_endpoint", f"{step.nodes[0]}:{port}", source))
    return out


def _check_step_shape(step: Step, role: str) -> None:
    """One launcher per node (it starts the node's processes itself), and one buffer."""
    n = len(step.nodes)
    if step.tasks != n:
        raise SlurmError(
            f"this Slurm step runs {step.tasks} tasks on {n} node(s) (SLURM_STEP_NUM_TASKS, "
            f"SLURM_STEP_NUM_NODES), so `asyncrl launch {role}` would start more than once on "
            "a node; it is one launcher per node, which starts that node's processes itself "
            "(torchrun's ranks, the actors): run it with srun --ntasks-per-node=1"
        )
    if role == "buffer" and n > 1:
        raise SlurmError(
            f"this Slurm step has {n} nodes (SLURM_STEP_NUM_NODES) and `asyncrl launch buffer` "
            "starts one Redis per launch: run the buffer in a step of one node "
            "(srun -N1 -n1 asyncrl launch buffer ...)"
        )


def _check_actor_nodes(step: Step, mine: dict) -> None:
    """More actor launches than ``actor.nnodes`` would wait for actor ids and fail."""
    n, nnodes = len(step.nodes), _int(mine, "actor.nnodes")
    if n > nnodes:
        raise SlurmError(
            f"this Slurm step starts `asyncrl launch actors` on {n} nodes "
            f"(SLURM_STEP_NUM_NODES) but actor.nnodes={nnodes}: the job has actor.num_actors "
            f"actors on each of actor.nnodes launches, so the launches past {nnodes} would "
            f"wait for actor ids and fail; set actor.nnodes={n} (or the nodes of every actor "
            "step together) for the learner and the actors alike"
        )


def _lines(job: SlurmJob, values: list[_Value], kept: list[str], notes: list[str]) -> list[str]:
    where = f"job {job.job_id}"
    if job.step is not None:
        where += f", node {job.step.node_id} of {len(job.step.nodes)}"
    lines = []
    if values:
        taken = ", ".join(f"{v.key}={v.value} ({v.source})" for v in values)
        lines.append(f"[asyncrl] from Slurm ({where}): {taken}")
    if kept:
        lines.append(
            f"[asyncrl] not from Slurm ({where}), as you set them: {', '.join(kept)} "
            f"({OFF_SWITCH}=0 ignores Slurm altogether)"
        )
    lines += [f"[asyncrl] Slurm ({where}): {note}" for note in notes]
    return lines


def _override(v: _Value) -> str:
    return f"{v.key}={v.value}" if isinstance(v.value, int) else f"{v.key}='{v.value}'"


def _int(raw: dict, key: str) -> int:
    """The integer ``key`` holds in a composed config (the schema has checked its type)."""
    value = _get(raw, key)
    if not isinstance(value, int):  # a ${oc.env:..} left unresolved by compose
        raise SlurmError(
            f"{key}={value!r}: give a number, which the Slurm step's nodes can be checked "
            f"against (or set {OFF_SWITCH}=0)"
        )
    return value


def _get(raw: dict, key: str) -> object:
    node: object = raw
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node
