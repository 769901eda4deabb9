"""The command line of each pod: ``asyncrl launch ROLE`` with the user's overrides, the same
on every role, and the keys the manifests own (``OWNED``), some of which Kubernetes fills in
when the pod starts:

    $(ASYNCRL_POD_IP)          the pod's IP (downward API ``status.podIP``)  -> network.bind
    $(JOB_COMPLETION_INDEX)    the pod's index in its indexed Job            -> learner.node_rank,
                                                                                run_dir
    ${oc.env:ASYNCRL_BUFFER_URL}  the buffer URL with the role's password, built by Kubernetes
                               from the Secret into the environment; asyncrl resolves it, so
                               no password is ever on argv or in config.json

``check_config`` composes every role's command line as a pod will, with stand-ins for those
three, so a config that a pod would refuse is refused here, before anything is applied.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from asyncrl.core.config.job import Config
from asyncrl.core.config.load import ConfigError, load_config
from asyncrl.orchestration.kubernetes.options import (
    BUFFER_MOUNT,
    PASSWORDS_MOUNT,
    RDZV_PORT,
    REDIS_PORT,
    SHARED_MOUNT,
    KubeError,
    Names,
)

POD_IP_ENV = "ASYNCRL_POD_IP"
INDEX_ENV = "JOB_COMPLETION_INDEX"  # set by the Job controller in an indexed Job's pods
BUFFER_URL_ENV = "ASYNCRL_BUFFER_URL"
POD_IP = f"$({POD_IP_ENV})"
INDEX = f"$({INDEX_ENV})"
BUFFER_URL = "${oc.env:" + BUFFER_URL_ENV + "}"
_STAND_IN_IP = "192.0.2.1"  # TEST-NET-1: an address no host holds
_STAND_IN_URL = "redis://learner:stand-in-password@buffer.invalid:6379/0"

OWNED = {
    "network.bind": "each pod binds its own IP (status.podIP)",
    "network.advertise": "each pod is reached at its own IP",
    "learner.node_rank": "each learner pod's completion index",
    "learner.rdzv_endpoint": "learner pod 0's DNS name",
    "learner.checkpoint_dir": f"a directory on the shared volume ({SHARED_MOUNT})",
    "run_dir": f"one per pod on the shared volume ({SHARED_MOUNT})",
    "buffer": "the manifests run the job's own Redis (buffer=local) and give the roles its URL",
    "buffer.url": "the buffer Service's URL, with the role's password from the Secret",
    "buffer.url_file": "the roles get the buffer URL from their environment",
    "buffer.port": f"the buffer Service's port, {REDIS_PORT}",
    "buffer.passwords_dir": "the buffer pod reads the passwords from the Secret's volume",
    "buffer.tls_dir": (
        "not supported by these manifests yet: the certificate would name the buffer pod's "
        "IP, while the roles connect by the Service's name"
    ),
}
"""Keys the manifests set, with why; a user override naming one is refused."""


@dataclass(frozen=True)
class RoleArgs:
    """Each role's arguments after ``asyncrl`` (``launch ROLE key=value ...``)."""

    buffer: list[str]
    learner: list[str]
    actors: list[str]


def run_dir(names: Names, role: str) -> str:
    """A learner or actor pod's run directory: one per index on the shared volume, so a pod
    restarted at the same index resumes it (the learner node's files, the actors' id token)."""
    return f"{SHARED_MOUNT}/{names.name}/{role}-{INDEX}"


def summary_path(names: Names) -> str:
    """Where the run's ``summary.json`` is: learner node 0's run directory."""
    return run_dir(names, "learner").replace(INDEX, "0") + "/summary.json"


def checkpoint_dir(names: Names) -> str:
    return f"{SHARED_MOUNT}/{names.name}/checkpoints"


def check_overrides(overrides: list[str]) -> None:
    """Refuse an override of a key in ``OWNED``, naming it and why."""
    for text in overrides:
        key = text.partition("=")[0].lstrip("+~")
        if key in OWNED:
            raise KubeError(f"{text!r}: {key} is set by the Kubernetes manifests ({OWNED[key]})")


def role_args(overrides: list[str], names: Names) -> RoleArgs:
    """The three roles' arguments: the user's ``overrides`` (each ``$`` doubled, so that
    Kubernetes, which expands ``$(VAR)`` and ``$$`` in args, gives asyncrl them as typed) and
    the keys every role shares, then each role's own."""
    user = [o.replace("$", "$$") for o in overrides]
    cache = f"model.cache_dir={SHARED_MOUNT}/cache"  # the demo model built once for every pod
    shared = [
        *([] if _names(overrides, "model.cache_dir") else [cache]),
        *user,
        f"network.bind={POD_IP}",
        f"learner.rdzv_endpoint={names.rendezvous_host}:{RDZV_PORT}",
        f"learner.checkpoint_dir={checkpoint_dir(names)}",
    ]
    client = [f"buffer.url={BUFFER_URL}"]
    return RoleArgs(
        buffer=["launch", "buffer", *shared, f"run_dir={BUFFER_MOUNT}/buffer",
                f"buffer.port={REDIS_PORT}", f"buffer.passwords_dir={PASSWORDS_MOUNT}"],
        learner=["launch", "learner", *shared, *client, f"run_dir={run_dir(names, 'learner')}",
                 f"learner.node_rank={INDEX}"],
        actors=["launch", "actors", *shared, *client, f"run_dir={run_dir(names, 'actors')}"],
    )  # fmt: skip


def check_config(overrides: list[str], names: Names) -> Config:
    """Compose every role's command line as its pod will (the last learner pod's too), with
    stand-ins for what Kubernetes fills in; returns learner pod 0's config. Raises
    ``KubeError`` with the config's own message."""
    check_overrides(overrides)
    args = role_args(overrides, names)
    cfg = _compose(args.learner, 0)
    _compose(args.learner, cfg.learner.nnodes - 1)
    _compose(args.buffer, 0, "buffer")
    _compose(args.actors, 0, "actors")
    return cfg


def _compose(argv: list[str], index: int, role: str = "learner") -> Config:
    env = {POD_IP_ENV: _STAND_IN_IP, INDEX_ENV: str(index)}
    stand_in = {f"buffer.url={BUFFER_URL}": f"buffer.url={_STAND_IN_URL}"}  # no env here
    overrides = [stand_in.get(o, o) for o in (expand(a, env) for a in argv[2:])]
    try:
        return load_config(overrides)
    except ConfigError as e:
        raise KubeError(f"the {role} pods' config: {e}") from None


def expand(text: str, env: Mapping[str, str]) -> str:
    """``text`` as Kubernetes expands a container's ``args``: ``$(VAR)`` becomes ``env[VAR]``
    when ``VAR`` is defined (else it stays), ``$$`` becomes ``$``, any other ``$`` stays."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        end = text.find(")", i + 2)
        if text.startswith("$(", i) and end != -1:
            out.append(env.get(text[i + 2 : end], text[i : end + 1]))
            i = end + 1
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def _names(overrides: list[str], key: str) -> bool:
    return any(o.partition("=")[0].lstrip("+~") == key for o in overrides)
