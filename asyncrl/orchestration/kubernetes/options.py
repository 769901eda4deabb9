"""What the manifests need besides the run's config: the user's Kubernetes options
(``KubeOptions``, checked when made), the objects' names (``Names``) and the fixed ports and
paths inside the pods.

Every name derives from ``KubeOptions.name`` (``asyncrl`` by default), so two jobs in one
namespace differ by that name alone::

    <name>-shared    PersistentVolumeClaim (ReadWriteMany): run directories, checkpoints, caches
    <name>-redis     Secret (made by the user): the ACL users' passwords, keys actor and learner
    <name>-buffer    Service + StatefulSet: ``asyncrl launch buffer`` (Redis; AOF on its own claim)
    <name>-learner   headless Service + indexed Job: ``asyncrl launch learner``, one pod per node
    <name>-actors    indexed Job: ``asyncrl launch actors``, one pod per ``actor.nnodes``
    <name>           NetworkPolicy: only the job's own pods reach the job's pods
"""

from __future__ import annotations

import re
from dataclasses import dataclass

REDIS_PORT = 6379
"""The buffer's Redis port (``buffer.port``), behind the ``<name>-buffer`` Service."""
RDZV_PORT = 29500
"""torchrun's rendezvous on learner pod 0 (``learner.rdzv_endpoint``)."""
SHARED_MOUNT = "/shared"
"""Where the shared claim is mounted in the learner and actor pods."""
BUFFER_MOUNT = "/data"
"""Where the buffer pod's own claim (its run directory: redis.conf, the AOF) is mounted."""
PASSWORDS_MOUNT = "/etc/asyncrl/redis"
"""Where the buffer pod sees the Secret's password files (``buffer.passwords_dir``)."""

_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # RFC 1035: Service names, host names
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # RFC 1123 label
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")  # RFC 1123 subdomain
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")
_NAME_MAX = 40  # "<name>-learner-<index>" must stay a host name label (63 characters)


class KubeError(ValueError):
    """The manifests cannot be rendered as asked; the message names the option or key and
    the fix."""


@dataclass(frozen=True)
class KubeOptions:
    """The Kubernetes side of a job, as ``asyncrl k8s render`` takes it (checked here)."""

    image: str
    """The container image of every pod: asyncrl installed (``asyncrl`` and ``python3`` on
    PATH) and, for the buffer, ``redis-server``. Required: there is no default image."""
    name: str = "asyncrl"
    """The prefix of every object's name (``Names``); lower-case letters, digits and ``-``,
    at most 40 characters, starting with a letter."""
    namespace: str = "default"
    """The namespace of every object."""
    storage_class: str = ""
    """The StorageClass of both claims; '' = the cluster's default. The shared claim needs a
    class that offers ReadWriteMany (NFS, CephFS, a cloud file store)."""
    shared_size: str = "100Gi"
    """The shared claim's size (a Kubernetes quantity)."""
    buffer_size: str = "10Gi"
    """The buffer's own claim's size: its run directory with the AOF."""
    shared_claim: str = ""
    """An existing ReadWriteMany claim to use as the shared volume instead of rendering
    ``<name>-shared`` (e.g. one that holds the model); '' = render it."""
    learner_gpus: int = 0
    """``nvidia.com/gpu`` per learner pod (one pod per learner node); 0 = none asked."""
    actor_gpus: int = 0
    """``nvidia.com/gpu`` per actor pod; 0 = none asked."""
    cluster_domain: str = "cluster.local"
    """The cluster's DNS domain, in learner pod 0's name (``Names.rendezvous_host``)."""
    env_secrets: tuple[str, ...] = ()
    """Secrets whose keys become environment variables of the learner and actor pods
    (``envFrom``), e.g. one holding ``HF_TOKEN`` or ``WANDB_API_KEY``."""

    def __post_init__(self) -> None:
        _check(
            bool(self.image.strip()),
            "--image is required: the container image with asyncrl installed (and "
            "redis-server, for the buffer); there is no default image",
        )
        _check(
            len(self.name) <= _NAME_MAX and bool(_LABEL.fullmatch(self.name)),
            f"--name {self.name!r}: give at most {_NAME_MAX} lower-case letters, digits and '-', "
            "starting with a letter (it prefixes every object's name and the pods' host names)",
        )
        _check(
            len(self.namespace) <= 63 and bool(_NAMESPACE.fullmatch(self.namespace)),
            f"--namespace {self.namespace!r} is not a namespace name (lower-case letters, digits "
            "and '-', at most 63)",
        )
        for option, value in (
            ("--storage-class", self.storage_class),
            ("--shared-claim", self.shared_claim),
            ("--cluster-domain", self.cluster_domain),
        ):
            _check(
                not value or bool(_SUBDOMAIN.fullmatch(value)),
                f"{option} {value!r} is not a Kubernetes object name (lower-case letters, digits, "
                "'-' and '.')",
            )
        _check(
            bool(self.cluster_domain), "--cluster-domain is empty (most clusters: cluster.local)"
        )
        for option, size in (
            ("--shared-size", self.shared_size),
            ("--buffer-size", self.buffer_size),
        ):
            _check(
                bool(_QUANTITY.fullmatch(size)),
                f"{option} {size!r} is not a Kubernetes quantity (e.g. 100Gi, 500Mi, 1Ti)",
            )
        for option, gpus in (
            ("--learner-gpus", self.learner_gpus),
            ("--actor-gpus", self.actor_gpus),
        ):
            _check(gpus >= 0, f"{option} {gpus}: give 0 (no GPU) or more")
        for secret in self.env_secrets:
            _check(
                bool(_SUBDOMAIN.fullmatch(secret)),
                f"--env-secret {secret!r} is not a Secret name (lower-case letters, digits, "
                "'-' and '.')",
            )


@dataclass(frozen=True)
class Names:
    """The objects' names and the DNS names the pods reach each other by."""

    name: str
    namespace: str
    cluster_domain: str

    @classmethod
    def of(cls, options: KubeOptions) -> Names:
        return cls(options.name, options.namespace, options.cluster_domain)

    @property
    def shared(self) -> str:
        return f"{self.name}-shared"

    @property
    def secret(self) -> str:
        return f"{self.name}-redis"

    @property
    def buffer(self) -> str:
        """The buffer's StatefulSet and its Service."""
        return f"{self.name}-buffer"

    @property
    def learner(self) -> str:
        """The learner's Job and its headless Service (the pods' ``subdomain``)."""
        return f"{self.name}-learner"

    @property
    def actors(self) -> str:
        return f"{self.name}-actors"

    def service_host(self, service: str) -> str:
        """A Service's DNS name: ``<service>.<namespace>.svc.<cluster domain>``."""
        return f"{service}.{self.namespace}.svc.{self.cluster_domain}"

    @property
    def buffer_host(self) -> str:
        return self.service_host(self.buffer)

    @property
    def rendezvous_host(self) -> str:
        """Learner pod 0's name, ``<job>-0.<headless service>.<namespace>.svc.<domain>``: an
        indexed Job's pod ``i`` has the host name ``<job>-i``, and with ``subdomain`` set to
        the headless Service this fully qualified name, which the kubelet also writes into
        the pod's own /etc/hosts (so pod 0 finds itself without waiting for DNS)."""
        return f"{self.learner}-0.{self.service_host(self.learner)}"


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise KubeError(message)
