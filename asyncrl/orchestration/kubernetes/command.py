"""``asyncrl k8s render --image IMG --out DIR [options] [overrides]``: the parser (light: no
import beyond argparse, so ``asyncrl --help`` stays instant) and the command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub, overrides_help: str, epilog: str) -> None:
    """``asyncrl k8s render``, as a sub-command of ``asyncrl``."""
    k8s = sub.add_parser("k8s", help="Kubernetes manifests of a job (docs/multinode.md)")
    verbs = k8s.add_subparsers(dest="verb", required=True)
    r = verbs.add_parser(
        "render",
        help="write the job's manifests as YAML (nothing is applied)",
        description="Write the Kubernetes objects of a job as YAML: the buffer (a StatefulSet\n"
        "running `asyncrl launch buffer`), the learner (an indexed Job, one pod per\n"
        "learner.nnodes), the actors (an indexed Job, one pod per actor.nnodes), a shared\n"
        "ReadWriteMany claim and a NetworkPolicy. The overrides are those of `asyncrl launch`,\n"
        "the same on every role. No file holds a password: the command prints how to make\n"
        "the Secret. Not yet run on a cluster (docs/multinode.md, Kubernetes).",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("overrides", nargs="*", help=overrides_help)
    r.add_argument("--image", default="", help="container image with asyncrl (required)")
    r.add_argument("--out", required=True, type=Path, help="directory for the YAML files")
    r.add_argument("--name", default="asyncrl", help="prefix of every object (default asyncrl)")
    r.add_argument("--namespace", default="default", help="namespace (default: default)")
    r.add_argument(
        "--storage-class",
        default="",
        help="StorageClass of the claims (default: "
        "the cluster's); the shared claim needs ReadWriteMany",
    )
    r.add_argument("--shared-size", default="100Gi", help="shared claim size (default 100Gi)")
    r.add_argument("--buffer-size", default="10Gi", help="buffer's claim size (default 10Gi)")
    r.add_argument(
        "--shared-claim",
        default="",
        help="an existing ReadWriteMany claim to use instead of rendering <name>-shared",
    )
    r.add_argument("--learner-gpus", type=int, default=0, help="nvidia.com/gpu per learner pod")
    r.add_argument("--actor-gpus", type=int, default=0, help="nvidia.com/gpu per actor pod")
    r.add_argument("--cluster-domain", default="cluster.local", help="the cluster's DNS domain")
    r.add_argument(
        "--env-secret",
        action="append",
        default=[],
        metavar="SECRET",
        help="a Secret whose keys become environment variables of the learner and "
        "actor pods (HF_TOKEN, WANDB_API_KEY); repeatable",
    )


def run(args) -> int:
    """``asyncrl k8s render``: render, write, say what was written and what to run next."""
    from asyncrl.orchestration.kubernetes.options import KubeError, KubeOptions
    from asyncrl.orchestration.kubernetes.render import next_steps, render, write

    try:
        options = KubeOptions(
            image=args.image,
            name=args.name,
            namespace=args.namespace,
            storage_class=args.storage_class,
            shared_size=args.shared_size,
            buffer_size=args.buffer_size,
            shared_claim=args.shared_claim,
            learner_gpus=args.learner_gpus,
            actor_gpus=args.actor_gpus,
            cluster_domain=args.cluster_domain,
            env_secrets=tuple(args.env_secret),
        )
        rendering = render(args.overrides, options)
    except KubeError as e:
        print(f"asyncrl: k8s: {e}", file=sys.stderr)
        return 2
    paths = write(rendering, args.out)
    for path in paths:
        kinds = ", ".join(
            f"{m['kind']} {m['metadata']['name']}" for m in rendering.files[path.stem]
        )
        print(f"[k8s] wrote {path}: {kinds}")
    for line in next_steps(rendering, paths):
        print(f"[k8s] {line}")
    print(
        "[k8s] not yet run on a cluster: the manifests are checked against the Kubernetes "
        "API schema only (docs/multinode.md, Kubernetes)"
    )
    return 0
