"""The parts of the pods (Kubernetes API dicts): environment, volumes, resources, the
containers of each role, and the init container that waits for the buffer.

Secrets reach a pod only through the Secret: the buffer reads its password files from a
volume (mode 0400), a learner or actor pod gets its role's password as an environment
variable (``secretKeyRef``) from which Kubernetes builds ``ASYNCRL_BUFFER_URL``
(``$(VAR)`` in an env value expands the variables defined above it). No password is in any
manifest, argument or command.
"""

from __future__ import annotations

from typing import Any

from asyncrl.orchestration.kubernetes.args import BUFFER_URL_ENV, POD_IP_ENV
from asyncrl.orchestration.kubernetes.options import (
    BUFFER_MOUNT,
    PASSWORDS_MOUNT,
    REDIS_PORT,
    SHARED_MOUNT,
    KubeOptions,
    Names,
)

Manifest = dict[str, Any]
"""One Kubernetes object (or a part of one) as the API takes it."""

PASSWORD_ENV = "ASYNCRL_REDIS_PASSWORD"
# the Secret's files as the buffer sees them: read_passwords (buffer/service/files.py)
# refuses group or other bits
PASSWORDS_MODE = 0o400
SHM_VOLUME = "dshm"  # /dev/shm is 64 MiB in a container; torch and vLLM need more

WAIT_FOR_BUFFER = """\
import os, socket, time
host, port = os.environ["ASYNCRL_BUFFER_HOST"], int(os.environ["ASYNCRL_BUFFER_PORT"])
while True:
    try:
        socket.create_connection((host, port), timeout=5).close()
        break
    except OSError as e:
        print(f"waiting for the buffer at {host}:{port}: {e}", flush=True)
        time.sleep(5)
"""
"""The init container's program: TCP connects to the buffer Service until it answers (the
Service has no endpoint until the buffer pod is ready), so a role does not fail its first
start on a buffer still starting. It needs no password: it sends nothing."""


def labels(names: Names, component: str) -> dict[str, str]:
    """The labels of a role's objects and pods; ``instance`` is the job (the NetworkPolicy
    admits the pods that carry it)."""
    return {
        "app.kubernetes.io/name": "asyncrl",
        "app.kubernetes.io/instance": names.name,
        "app.kubernetes.io/component": component,
    }


def metadata(names: Names, name: str, component: str) -> Manifest:
    return {"name": name, "namespace": names.namespace, "labels": labels(names, component)}


def pod_ip_env() -> Manifest:
    return {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def client_env(names: Names, user: str) -> list[Manifest]:
    """A learner or actor pod's buffer URL: the ACL ``user``'s password from the Secret, then
    the URL Kubernetes builds with it (asyncrl reads it through ``${oc.env:...}``)."""
    password = {"secretKeyRef": {"name": names.secret, "key": user}}
    url = f"redis://{user}:$({PASSWORD_ENV})@{names.buffer_host}:{REDIS_PORT}/0"
    return [
        {"name": PASSWORD_ENV, "valueFrom": password},
        {"name": BUFFER_URL_ENV, "value": url},
    ]


def resources(gpus: int) -> Manifest:
    """``nvidia.com/gpu`` as a limit (extended resources are asked by their limit)."""
    return {"limits": {"nvidia.com/gpu": gpus}} if gpus else {}


def shared_volume(names: Names, options: KubeOptions) -> Manifest:
    claim = options.shared_claim or names.shared
    return {"name": "shared", "persistentVolumeClaim": {"claimName": claim}}


def shm_volume() -> Manifest:
    return {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}}


def passwords_volume(names: Names) -> Manifest:
    return {
        "name": "passwords",
        "secret": {"secretName": names.secret, "defaultMode": PASSWORDS_MODE},
    }


def container(options: KubeOptions, role: str, args: list[str], env: list[Manifest]) -> Manifest:
    """A role's main container: ``asyncrl <args>`` in the user's image."""
    return {
        "name": role,
        "image": options.image,
        "command": ["asyncrl"],
        "args": args,
        "env": [pod_ip_env(), {"name": "PYTHONUNBUFFERED", "value": "1"}, *env],
    }


def role_container(names: Names, options: KubeOptions, role: str, args: list[str]) -> Manifest:
    """A learner or actor pod's main container: the buffer URL of its ACL user, the shared
    volume, a large /dev/shm, its GPUs (``--learner-gpus``, ``--actor-gpus``) and the user's
    Secrets as environment."""
    user = "learner" if role == "learner" else "actor"
    hf_home = {"name": "HF_HOME", "value": f"{SHARED_MOUNT}/hf"}  # one Hub download per job
    out = container(options, role, args, [*client_env(names, user), hf_home])
    out["volumeMounts"] = [
        {"name": "shared", "mountPath": SHARED_MOUNT},
        {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
    ]
    if options.env_secrets:
        out["envFrom"] = [{"secretRef": {"name": s}} for s in options.env_secrets]
    gpus = options.learner_gpus if role == "learner" else options.actor_gpus
    if gpus:
        out["resources"] = resources(gpus)
    return out


def wait_for_buffer(names: Names, options: KubeOptions) -> Manifest:
    """The init container that waits until the buffer Service answers (``WAIT_FOR_BUFFER``)."""
    return {
        "name": "wait-for-buffer",
        "image": options.image,
        "command": ["python3", "-c", WAIT_FOR_BUFFER],
        "env": [
            {"name": "ASYNCRL_BUFFER_HOST", "value": names.buffer_host},
            {"name": "ASYNCRL_BUFFER_PORT", "value": str(REDIS_PORT)},
        ],
    }


def buffer_container(options: KubeOptions, args: list[str]) -> Manifest:
    """The buffer's container: ``asyncrl launch buffer`` with its claim and the Secret's
    password files, ready once Redis accepts connections."""
    out = container(options, "buffer", args, [])
    out["ports"] = [{"name": "redis", "containerPort": REDIS_PORT}]
    out["volumeMounts"] = [
        {"name": "data", "mountPath": BUFFER_MOUNT},
        {"name": "passwords", "mountPath": PASSWORDS_MOUNT, "readOnly": True},
    ]
    out["readinessProbe"] = {"tcpSocket": {"port": "redis"}, "periodSeconds": 5}
    return out
