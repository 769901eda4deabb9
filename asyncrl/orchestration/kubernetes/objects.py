"""The Kubernetes objects of one job (``objects(job)``), by the file they are written to::

    shared.yaml    PersistentVolumeClaim <name>-shared (ReadWriteMany; not with --shared-claim),
                   NetworkPolicy <name> (ingress to the job's pods from the job's pods only)
    buffer.yaml    Service <name>-buffer (ClusterIP, port 6379), StatefulSet <name>-buffer
                   (one pod; its run directory and AOF on a volumeClaimTemplate)
    learner.yaml   Service <name>-learner (headless: the pods' DNS names), Job <name>-learner
                   (Indexed, one pod per learner node; node_rank = the completion index)
    actors.yaml    Job <name>-actors (Indexed, one pod per actor.nnodes; run_dir per index)

The roles are indexed Jobs with ``restartPolicy: OnFailure``: a failed container restarts in
the same pod (same IP, host name and run directory), and the Job ends when every index has
exited 0 (the learner at the end of the run; the actors when the learner stops them). A pod
replaced at the same index keeps the run directory of that index, so a learner node resumes
from the newest checkpoint and an actor launch gets its actor ids back (docs/multinode.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.orchestration.kubernetes.args import RoleArgs
from asyncrl.orchestration.kubernetes.options import RDZV_PORT, REDIS_PORT, KubeOptions, Names
from asyncrl.orchestration.kubernetes.pods import (
    Manifest,
    buffer_container,
    labels,
    metadata,
    passwords_volume,
    role_container,
    shared_volume,
    shm_volume,
    wait_for_buffer,
)

BACKOFF_LIMIT = 6
"""Container restarts (each counts as a failure) before a Job gives up: Kubernetes' default,
written out. ``learner.restart_max`` / ``actor.restart_max`` restart inside a pod first."""
GRACE_S = {"buffer": 60, "learner": 300, "actors": 60}
"""Seconds from SIGTERM to SIGKILL: the learner writes a final checkpoint when stopped, the
buffer flushes its AOF, the actors release their ids."""


@dataclass(frozen=True)
class Job:
    """What the objects are made of: the user's options, the names, each role's arguments
    and the node counts of the run's config."""

    options: KubeOptions
    names: Names
    args: RoleArgs
    learner_nodes: int
    """``learner.nnodes``: the learner Job's completions and parallelism."""
    actor_nodes: int
    """``actor.nnodes``: the actors Job's completions and parallelism."""


def objects(job: Job) -> dict[str, list[Manifest]]:
    """Every object of the job, by file stem. The order of applying them does not matter
    (``kubectl apply -f DIR`` takes the files by name): a pod waits for its claim and its
    Secret, a role's init container for the buffer."""
    return {
        "shared": shared(job),
        "buffer": buffer(job),
        "learner": learner(job),
        "actors": actors(job),
    }


def shared(job: Job) -> list[Manifest]:
    names, options = job.names, job.options
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(names, names.name, "network"),
        "spec": {
            "podSelector": {"matchLabels": _job_labels(names)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": _job_labels(names)}}]}],
        },
    }
    if options.shared_claim:
        return [policy]
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(names, names.shared, "shared"),
        "spec": claim_spec("ReadWriteMany", options.shared_size, options.storage_class),
    }
    return [claim, policy]


def buffer(job: Job) -> list[Manifest]:
    names, options = job.names, job.options
    pod_labels = labels(names, "buffer")
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(names, names.buffer, "buffer"),
        "spec": {
            "selector": pod_labels,
            "ports": [{"name": "redis", "port": REDIS_PORT, "targetPort": "redis"}],
        },
    }
    data = {
        "metadata": {"name": "data", "labels": pod_labels},
        "spec": claim_spec("ReadWriteOnce", options.buffer_size, options.storage_class),
    }
    stateful_set = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(names, names.buffer, "buffer"),
        "spec": {
            "serviceName": names.buffer,
            "replicas": 1,
            "selector": {"matchLabels": pod_labels},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "terminationGracePeriodSeconds": GRACE_S["buffer"],
                    "containers": [buffer_container(options, job.args.buffer)],
                    "volumes": [passwords_volume(names)],
                },
            },
            "volumeClaimTemplates": [data],
        },
    }
    return [service, stateful_set]


def learner(job: Job) -> list[Manifest]:
    """The headless Service that gives learner pod ``i`` the DNS name
    ``<job>-i.<service>...`` (also before it is ready: torchrun on node 1 may look up node 0
    while node 0 still waits for the buffer), and the learner's indexed Job."""
    names = job.names
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(names, names.learner, "learner"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": labels(names, "learner"),
            "ports": [{"name": "rendezvous", "port": RDZV_PORT}],
        },
    }
    container = role_container(names, job.options, "learner", job.args.learner)
    container["ports"] = [{"name": "rendezvous", "containerPort": RDZV_PORT}]
    return [service, indexed_job(job, "learner", container, job.learner_nodes)]


def actors(job: Job) -> list[Manifest]:
    container = role_container(job.names, job.options, "actors", job.args.actors)
    return [indexed_job(job, "actors", container, job.actor_nodes)]


def indexed_job(job: Job, role: str, container: Manifest, pods: int) -> Manifest:
    """An indexed Job of ``pods`` pods running at once, each waiting for the buffer first."""
    names = job.names
    pod_spec: Manifest = {
        "restartPolicy": "OnFailure",
        "terminationGracePeriodSeconds": GRACE_S[role],
        "initContainers": [wait_for_buffer(names, job.options)],
        "containers": [container],
        "volumes": [shared_volume(names, job.options), shm_volume()],
    }
    if role == "learner":
        pod_spec["subdomain"] = names.learner  # the headless Service: pod DNS names
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(names, names.learner if role == "learner" else names.actors, role),
        "spec": {
            "completionMode": "Indexed",
            "completions": pods,
            "parallelism": pods,
            "backoffLimit": BACKOFF_LIMIT,
            "template": {"metadata": {"labels": labels(names, role)}, "spec": pod_spec},
        },
    }


def claim_spec(access: str, size: str, storage_class: str) -> Manifest:
    spec: Manifest = {"accessModes": [access], "resources": {"requests": {"storage": size}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    return spec


def _job_labels(names: Names) -> dict[str, str]:
    """The labels every pod of the job carries (``labels`` without the component)."""
    return {k: v for k, v in labels(names, "").items() if k != "app.kubernetes.io/component"}
