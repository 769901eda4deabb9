"""A run's overrides and the Kubernetes options in, the job's objects out (``render``), then
written as YAML (``write``) with what to run next (``next_steps``).

    overrides ──check_config (args.py)──▶ Config ──▶ Job (objects.py) ──▶ {file: [objects]}
              every role's command line composed as its pod will: a config a pod would
              refuse is refused here

The files hold no password: the Secret is made by the user, once (``secret_command``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from asyncrl.core.config.job import Config
from asyncrl.orchestration.kubernetes.args import check_config, checkpoint_dir, role_args
from asyncrl.orchestration.kubernetes.args import summary_path as _summary_path
from asyncrl.orchestration.kubernetes.objects import Job, objects
from asyncrl.orchestration.kubernetes.options import KubeError, KubeOptions, Names
from asyncrl.orchestration.kubernetes.pods import Manifest


@dataclass(frozen=True)
class Rendering:
    """The job's objects by file stem, and what they were made from."""

    files: dict[str, list[Manifest]]
    names: Names
    cfg: Config
    """Learner pod 0's config, as its pod composes it (with a stand-in address)."""

    @property
    def manifests(self) -> list[Manifest]:
        return [m for ms in self.files.values() for m in ms]


def render(overrides: list[str], options: KubeOptions) -> Rendering:
    """The job's objects for ``overrides`` (those of ``asyncrl launch``) and ``options``.
    Raises ``KubeError`` naming the option or key and the fix."""
    names = Names.of(options)
    cfg = check_config(overrides, names)
    check_gpus(cfg, options)
    job = Job(
        options=options,
        names=names,
        args=role_args(overrides, names),
        learner_nodes=cfg.learner.nnodes,
        actor_nodes=cfg.actor.nnodes,
    )
    return Rendering(files=objects(job), names=names, cfg=cfg)


def check_gpus(cfg: Config, options: KubeOptions) -> None:
    """GPUs asked per pod cover what that pod's launch places: ``learner.nproc`` ranks, and
    ``actor.num_actors x actor.tensor_parallel_size`` for the actors (docs/gpu.md)."""
    ranks = cfg.learner.nproc
    if 0 < options.learner_gpus < ranks:
        raise KubeError(
            f"--learner-gpus {options.learner_gpus} is fewer than the learner.nproc={ranks} "
            f"ranks each learner pod starts, one per GPU: give --learner-gpus {ranks} or "
            f"learner.nproc={options.learner_gpus}"
        )
    a = cfg.actor
    need = a.num_actors * a.tensor_parallel_size
    if 0 < options.actor_gpus < need:
        raise KubeError(
            f"--actor-gpus {options.actor_gpus} is fewer than each actor pod's "
            f"actor.num_actors={a.num_actors} x actor.tensor_parallel_size="
            f"{a.tensor_parallel_size} = {need} GPUs: give --actor-gpus {need}"
        )


def write(rendering: Rendering, out: Path) -> list[Path]:
    """Write each file of ``rendering`` into ``out`` (made if missing; mode 0644: no file
    holds a secret) and return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for stem, manifests in rendering.files.items():
        path = out / f"{stem}.yaml"
        text = to_yaml(manifests)
        path.write_text(f"# asyncrl k8s render: {stem} (docs/multinode.md, Kubernetes)\n{text}")
        os.chmod(path, 0o644)
        paths.append(path)
    return paths


def to_yaml(manifests: list[Manifest]) -> str:
    """``manifests`` as one YAML stream (``---`` between objects) in their own key order, with
    no anchors (a dict used twice is written twice) and multi-line strings as blocks."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data) -> bool:
            return True

    def text(dumper, value: str):
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return yaml.dump_all(manifests, Dumper=Dumper, sort_keys=False, default_flow_style=False)


def secret_command(names: Names) -> str:
    """The command that makes the Secret once, with fresh passwords that never touch a file
    or an argument list (bash or zsh process substitution; ``tr`` drops the newline, which
    ``buffer.passwords_dir`` refuses)."""
    from asyncrl.buffer.service.files import ROLE_USERS

    fresh = "<(openssl rand -hex 24 | tr -d '\\n')"
    keys = " ".join(f"--from-file={user}={fresh}" for user in ROLE_USERS)
    return f"kubectl -n {names.namespace} create secret generic {names.secret} {keys}"


def next_steps(rendering: Rendering, paths: list[Path]) -> list[str]:
    """What the user runs next, and where the results are."""
    names, out = rendering.names, paths[0].parent if paths else Path(".")
    ns = f"kubectl -n {names.namespace}"
    pods = f"app.kubernetes.io/instance={names.name}"
    node0 = f"{pods},app.kubernetes.io/component=learner,batch.kubernetes.io/job-completion-index=0"
    roles = " ".join(f"-f {out / f'{stem}.yaml'}" for stem in ("buffer", "learner", "actors"))
    return [
        "the Redis passwords are in no file here; make the Secret once (bash or zsh):",
        f"  {secret_command(names)}",
        "then apply:",
        f"  {ns} apply -f {out}",
        "follow (learner node 0 reports the run):",
        f"  {ns} get pods -l {pods}",
        f"  {ns} logs -f -l {node0}",
        f"results on the shared volume: {_summary_path(names)}, checkpoints in "
        f"{checkpoint_dir(names)}",
        f"when the learner Job has completed: {ns} delete {roles}",
        "  (the claims, with the results and the buffer's AOF, and the Secret stay until you "
        "delete them)",
    ]
