"""The roles a launch starts: each one's command line and environment, started as a
supervised process (launcher.py ``spawn``) on its GPUs, and what the launch holds while
they run (``Started``: roles, actor ids, buffer), stopped in reverse order.

    learner   torchrun -m asyncrl.learner.main      ``learner_cmd``: this node's ranks
    actor<i>  python -m asyncrl.actors.main         ``actor_cmd``: one per claimed actor id

The buffer URL reaches a role in its environment (``role_env``), never on argv: it holds a
password.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from asyncrl.core.config.job import Config
from asyncrl.core.net.endpoints import register_endpoint
from asyncrl.core.runtime.torchrun import free_port
from asyncrl.orchestration.launch.actor_ids import IdKeeper
from asyncrl.orchestration.launch.launcher import Role, show_progress, spawn, stop_roles
from asyncrl.orchestration.launch.role_log import LogLimits
from asyncrl.orchestration.launch.run_info import write_run_info
from asyncrl.orchestration.launch.stop_signals import begin_shutdown
from asyncrl.orchestration.placement.plan import NO_GPUS, Plan

if TYPE_CHECKING:
    from asyncrl.buffer.service.server import RedisServer


def spawn_learner(
    cfg: Config, run_dir: Path, model_dir: str, url: str, plan: Plan = NO_GPUS
) -> Role:
    """The learner (torchrun, on ``plan``'s learner GPUs); with ``learner.restart_max=N`` a
    dead one is started again, on a fresh rendezvous port, and resumes from its newest
    checkpoint."""
    across = cfg.learner.nnodes > 1
    env = role_env(cfg, url, cfg.learner.cpu_threads, across, plan.learner_visible())
    cmd = lambda: learner_cmd(cfg, run_dir, model_dir)  # noqa: E731 (a fresh port each start)
    role = spawn("learner", cmd, env, run_dir, show_progress, cfg.learner.cpu_affinity,
                 log_limits(cfg))  # fmt: skip
    role.restart_max, role.restart_key = cfg.learner.restart_max, "learner.restart_max"
    return role


def spawn_actors(
    cfg: Config, run_dir: Path, model_dir: str, url: str, ids: list[int], plan: Plan = NO_GPUS
) -> list[Role]:
    """One process per actor id, the j-th on ``plan``'s j-th actor GPUs; each may be restarted
    ``actor.restart_max`` times if it dies (keeping its id and GPUs, so it resumes its prompt
    cursor)."""
    roles = []
    for j, i in enumerate(ids):
        env = role_env(cfg, url, cfg.actor.cpu_threads, gpus=plan.actor_visible(j))
        cmd = actor_cmd(run_dir, model_dir, i)
        role = spawn(f"actor{i}", cmd, env, run_dir, show_progress, cfg.actor.cpu_affinity,
                     log_limits(cfg))  # fmt: skip
        role.restart_max, role.restart_key = cfg.actor.restart_max, "actor.restart_max"
        roles.append(role)
    return roles


def log_limits(cfg: Config) -> LogLimits:
    """The ``role_log_*`` settings as ``role_log.LogLimits``."""
    return LogLimits(
        max_bytes=max(1, int(cfg.role_log_max_mb * (1 << 20))),
        backups=cfg.role_log_backups,
        line_chars=cfg.role_log_line_chars,
    )


def role_env(
    cfg, redis_url: str, threads: int, across_nodes: bool = False, gpus: str | None = None
) -> dict[str, str]:
    """A role's environment: the buffer URL (never argv: it holds a password), thread counts;
    NCCL's bootstrap on ``network.interface`` (loopback by default) unless the user set
    ``NCCL_SOCKET_IFNAME``; for learner ranks on several nodes gloo too (asyncrl/orchestration/launch/hostnet.py).
    Otherwise gloo's sockets stay on loopback. ``gpus``: the role's
    ``CUDA_VISIBLE_DEVICES`` (asyncrl/orchestration/placement/plan.py); None = the launcher's, inherited."""
    from asyncrl.orchestration.launch.hostnet import nccl_env, socket_env

    env = {**nccl_env(cfg.network), **os.environ}
    if across_nodes:
        env.update(socket_env(cfg.network))
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    env.update(
        ASYNCRL_REDIS_URL=redis_url,
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    return env


def learner_cmd(cfg, run_dir: Path, model_dir: str) -> list[str]:
    """torchrun for this node's learner ranks; its rendezvous store binds one address only
    (asyncrl/core/runtime/torchrun.py): loopback on one node, else ``learner.rdzv_endpoint`` (hosted by
    node 0)."""
    ln = cfg.learner
    if ln.nnodes == 1:  # one node: the ranks talk over loopback, whatever network.bind is
        master = ["--master_addr=127.0.0.1", f"--master_port={free_port()}"]
    else:
        host, _, port = ln.rdzv_endpoint.rpartition(":")
        master = [f"--master_addr={host.strip('[]')}", f"--master_port={port}"]
    torchrun = [sys.executable, "-m", "asyncrl.core.runtime.torchrun"]
    nodes = [f"--nnodes={ln.nnodes}", f"--node_rank={ln.node_rank}", f"--nproc_per_node={ln.nproc}"]
    learner = ["-m", "asyncrl.learner.main", "--run-dir", str(run_dir), "--model-dir", model_dir]
    return [*torchrun, *nodes, *master, *learner]


def actor_cmd(run_dir: Path, model_dir: str, actor_id: int) -> list[str]:
    dirs = ["--run-dir", str(run_dir), "--model-dir", model_dir]
    return [sys.executable, "-m", "asyncrl.actors.main", *dirs, "--actor-id", str(actor_id)]


def serve_launcher_metrics(
    cfg: Config, url: str, name: str, roles: list[Role], server: RedisServer | None = None
) -> None:
    """This process's /metrics (which roles are up), recorded in the buffer's endpoints."""
    from asyncrl.buffer.connection import connect
    from asyncrl.core.observe.metrics import LauncherMetrics, role_port, serve

    info = {"buffer_name": cfg.buffer.name, "mode": cfg.mode.name}
    metrics = LauncherMetrics(info, lambda: list(roles), server)
    port = serve(metrics.registry, role_port(cfg.metrics_port, "launcher"), cfg.network.metrics)
    if port:
        client = connect(url)
        register_endpoint(client, cfg.buffer.name, name, port, cfg.network, gpus="")
        client.close()
        print(f"[asyncrl] metrics: http://{cfg.network.metrics}:{port}/metrics", flush=True)


@dataclass
class Started:
    """What a launch has started, filled in as it starts each part; ``stop`` ends them in
    reverse: the roles, then the actor ids they held, then the buffer they wrote to."""

    roles: list[Role] = field(default_factory=list)
    """The supervised role processes (the launcher's /metrics reads this same list)."""
    keeper: IdKeeper | None = None
    """The actor ids this launch claimed in the buffer (None before the claim)."""
    server: RedisServer | None = None
    """The private redis-server (None before it started, or with ``buffer.url``)."""

    def stop(self, run_dir: Path) -> None:
        """Stop everything started, whatever failed; the buffer's restarts go to ``run.json``."""
        begin_shutdown()  # from here on a signal hurries the shutdown instead of breaking it
        stop_roles(self.roles)
        if self.keeper:
            self.keeper.close()
        if self.server:
            self.server.stop()
            write_run_info(run_dir, redis_restarts=self.server.restarts)
