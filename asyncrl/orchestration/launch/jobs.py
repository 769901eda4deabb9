"""What ``asyncrl run`` and ``asyncrl launch <role>`` do, top to bottom."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from asyncrl.core.config import cores
from asyncrl.core.config.job import Config
from asyncrl.core.config.load import ConfigError, config_to_json, config_to_yaml
from asyncrl.core.net.endpoints import launcher_role, register_endpoint
from asyncrl.core.observe.trackers import check_available
from asyncrl.core.runtime import rundir
from asyncrl.core.runtime.lifeline import child_cmd
from asyncrl.orchestration.launch.actor_ids import IdKeeper, interrupted
from asyncrl.orchestration.launch.launcher import (
    Role,
    actor_cmd,
    begin_shutdown,
    import_heavy_modules,
    learner_cmd,
    role_env,
    show_progress,
    spawn,
    stop_roles,
    supervise,
)
from asyncrl.orchestration.launch.resume_config import check_resume
from asyncrl.orchestration.models.directory import check_model_dir
from asyncrl.orchestration.placement.gpus import check_shared_gpu, node_gpus, plan_node
from asyncrl.orchestration.placement.plan import NO_GPUS, Plan

ALL_ROLES = ("buffer", "learner", "actors")


def prepare_run_dir(cfg: Config, roles: tuple[str, ...] = ALL_ROLES) -> Path:
    """Create, check and lock ``run_dir`` for ``roles`` (asyncrl/core/runtime/rundir.py); write the config
    (``config.json``, which the roles read, and the same as ``config.yaml``, for people)."""
    run_dir = rundir.prepare(cfg.run_dir, roles)
    cfg.run_dir = str(run_dir)
    cfg.experiment_name = cfg.experiment_name or run_dir.name
    check_resume(cfg, run_dir)
    try:
        rundir.write_atomic(run_dir / "config.json", config_to_json(cfg), 0o644)
        rundir.write_atomic(run_dir / "config.yaml", config_to_yaml(cfg), 0o644)
    except OSError as e:
        why = rundir.describe_os_error(e)
        raise rundir.RunDirError(f"cannot write the run's config: {why}") from None
    return run_dir


def write_run_info(run_dir: Path, **info) -> None:
    """``run.json``: what this run resolved (model directory, core split); no secrets."""
    path = run_dir / "run.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    rundir.write_atomic(path, json.dumps({**old, **info}, indent=2), 0o644)


def resolve_model(cfg: Config, weights: bool = True) -> str:
    """``demo`` -> build (or reuse) the cached tiny model; else the local HF directory that
    ``model.path`` names or becomes (a GGUF file converted, a Hub id fetched:
    asyncrl/orchestration/models/source.py), checked (its weight files too when ``weights``:
    not for simulated actors, which read only the config)."""
    if cfg.model.path == "demo":
        from asyncrl.orchestration.demo.warmstart import prepare_demo_model

        return str(
            prepare_demo_model(cfg.model.cache_dir, seed=cfg.seed, sft_steps=cfg.model.sft_steps)
        )
    from asyncrl.orchestration.models.source import resolve_model_path

    say = lambda text: print(f"[asyncrl] {text}", flush=True)  # noqa: E731
    path = resolve_model_path(cfg.model.path, cfg.model.cache_dir, say)
    check_model_dir(path, "model.path", weights)  # asyncrl/orchestration/models/directory.py
    return str(path.resolve())


def warn_model_settings(cfg: Config, detect: Callable[[], tuple[str, ...]] | None = None) -> None:
    """Print each setting far outside a pretrained model's range, and a pretrained model's CPU
    learner on a node with GPUs (model_advice.py; ``detect``: this node's GPUs, default
    ``node_gpus``, asked only then): once per run or launched role, before its model
    resolves (benchmarks resolve models silently)."""
    from asyncrl.orchestration.models.advice import model_warnings, placement_warnings

    for warning in model_warnings(cfg) + placement_warnings(cfg, detect or node_gpus):
        print(f"[asyncrl] warning: {warning}", flush=True)


def start_buffer(cfg: Config, run_dir: Path):
    """(url, server or None): the configured Redis, or a private one in ``run_dir/redis``."""

    if cfg.buffer.url:
        check_access(cfg.buffer.url, cfg.buffer.name)  # fail now, with the URL in the message
        return cfg.buffer.url, None
    server = _redis_server(cfg, run_dir).start()
    server.watch(lambda text: print(text, flush=True))  # restart it from its AOF if it dies
    return server.url, server


def check_access(url: str, name: str) -> None:
    """Connect to ``url`` and read a key of buffer ``name``: a wrong password, host or key
    prefix (``launch buffer`` gives its ACL users the keys of its own ``buffer.name``) fails
    now with the fix, not as a traceback inside a role."""
    import redis

    from asyncrl.buffer.connection import BufferUnavailable, connect, mask_url

    client = connect(url)
    try:
        client.exists(f"{name}:meta")
    except redis.exceptions.NoPermissionError:
        raise ValueError(
            f"the Redis user of buffer.url ({mask_url(url)}) may not use the keys of "
            f"buffer.name={name!r}: `asyncrl launch buffer` grants its users the keys of its own "
            "buffer.name; give every role the same buffer.name"
        ) from None
    except redis.RedisError as e:
        raise BufferUnavailable(f"Redis at {mask_url(url)} failed: {e}") from None
    finally:
        client.close()


def _redis_server(cfg: Config, run_dir: Path):
    """The private redis-server in ``run_dir/redis``; it dies with this process and holds the
    run directory's lock while it lives."""
    from asyncrl.buffer.service.server import RedisServer

    return RedisServer(
        run_dir / "redis",
        key_prefix=cfg.buffer.name,
        wrap=child_cmd,
        pass_fds=rundir.held_fds(),
        host=cfg.network.bind,
        advertise=cfg.network.advertise,
        tls=_tls_files(cfg),
    )


def _tls_files(cfg: Config):
    """``buffer.tls_dir``'s files (made when missing) for the advertised address, or None."""
    if not cfg.buffer.tls_dir:
        return None
    from asyncrl.buffer.service.tls import TlsError, ensure

    ips = list(dict.fromkeys([cfg.network.address, "127.0.0.1"]))  # + loopback: local tools
    try:
        return ensure(cfg.buffer.tls_dir, ips, say=lambda t: print(f"[buffer] {t}", flush=True))
    except TlsError as e:
        raise ConfigError(f"buffer.tls_dir: {e}") from None


def role_url(url: str, server, role: str) -> str:
    """The URL a role gets: its least-privilege ACL user on our private Redis (``actor`` or
    ``learner``, see asyncrl.buffer.service.files.ROLE_USERS), else the configured ``buffer.url``."""
    return server.url_for(role) if server is not None else url


def core_split(cfg: Config) -> str:
    n = os.cpu_count() or 1
    lt, at = cfg.learner.cpu_threads, cfg.actor.cpu_threads
    la = f"cores {cfg.learner.cpu_affinity}" if cfg.learner.cpu_affinity else "any core"
    aa = f"cores {cfg.actor.cpu_affinity}" if cfg.actor.cpu_affinity else "any core"
    line = (
        f"cores: {n} available; learner {cfg.learner.nproc} rank(s) x {lt} thread(s) "
        f"on {la}, {cfg.actor.num_actors} actor(s) x {at} thread(s) on {aa} "
        f"(vLLM bind {cfg.actor.cpu_bind or 'auto'})"
    )
    if not (cfg.learner.cpu_affinity or cfg.actor.cpu_affinity):
        busy = cfg.learner.nproc * lt + cfg.actor.num_actors * at
        line += (
            f"; unpinned: the OS shares the {n} cores among {busy} busy threads, so an "
            "idle side lends its core to the other (pin with learner.cpu_affinity= and "
            "actor.cpu_affinity=)"
        )
    return line


def spawn_learner(
    cfg: Config, run_dir: Path, model_dir: str, url: str, plan: Plan = NO_GPUS
) -> Role:
    """The learner (torchrun, on ``plan``'s learner GPUs); with ``learner.restart_max=N`` a
    dead one is started again, on a fresh rendezvous port, and resumes from its newest
    checkpoint."""
    across = cfg.learner.nnodes > 1
    env = role_env(cfg, url, cfg.learner.cpu_threads, across, plan.learner_visible())
    cmd = lambda: learner_cmd(cfg, run_dir, model_dir)  # noqa: E731 (a fresh port each start)
    role = spawn("learner", cmd, env, run_dir, show_progress, cfg.learner.cpu_affinity)
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
        role = spawn(f"actor{i}", cmd, env, run_dir, show_progress, cfg.actor.cpu_affinity)
        role.restart_max, role.restart_key = cfg.actor.restart_max, "actor.restart_max"
        roles.append(role)
    return roles


def announce_gpus(run_dir: Path, plan: Plan, actor_ids: list[int]) -> None:
    """Print the plan once and record it in ``run.json`` (nothing for a CPU run)."""
    if not plan.empty:
        _say(f"[asyncrl] {plan.describe(actor_ids)}")
        write_run_info(run_dir, gpus=plan.by_role(actor_ids))


def record_restarts(run_dir: Path, roles: list[Role]) -> dict[str, int]:
    """Restarts per role, into ``run.json`` (the launcher's record; ``summary.json`` is the
    learner's alone)."""
    restarts = {r.name: r.restarts for r in roles}
    write_run_info(run_dir, role_restarts=restarts)
    return restarts


def serve_launcher_metrics(
    cfg: Config, url: str, name: str, roles: list[Role], server=None
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


def run_local(cfg: Config) -> int:
    """Everything on this machine: buffer, learner (torchrun) and actors; returns an exit code."""
    if cfg.learner.nnodes > 1 or cfg.actor.nnodes > 1:
        raise ValueError(
            f"asyncrl run starts the roles of one machine, but learner.nnodes="
            f"{cfg.learner.nnodes} and actor.nnodes={cfg.actor.nnodes}; run `asyncrl launch "
            "buffer|learner|actors` on each node group instead (docs/multinode.md)"
        )
    check_network(cfg)
    plan = plan_node(cfg, ("learner", "actors"))  # a refused GPU layout fails before anything
    pinned = cores.resolve(cfg, sorted(os.sched_getaffinity(0)), both_sides=True)
    run_dir = prepare_run_dir(cfg)
    print(f"[asyncrl] run dir {run_dir}\n[asyncrl] {core_split(cfg)}", flush=True)
    if pinned:
        print(f"[asyncrl] {pinned}", flush=True)
    import_heavy_modules()  # a stop during torch's import takes effect after it
    check_reward_fn(cfg)  # bad input fails here, before the warm start and any process
    check_available(cfg.logger)  # a tracker's missing library too
    warn_model_settings(cfg)  # config only: shown even when the model is refused next
    model_dir = resolve_model(cfg)  # a bad model directory fails before any process starts
    if split := check_shared_gpu(cfg, plan, Path(model_dir)):
        print(f"[asyncrl] {split}", flush=True)  # learner.share_gpu: refused above if no fit
    check_data(cfg, model_dir)  # and bad data (files, columns, templates, lengths)
    roles: list[Role] = []
    server = keeper = None
    try:
        url, server = start_buffer(cfg, run_dir)
        write_run_info(run_dir, model_dir=model_dir, cores=core_split(cfg))
        serve_launcher_metrics(cfg, url, "launcher", roles, server)
        learner_url = role_url(url, server, "learner")
        roles.append(spawn_learner(cfg, run_dir, model_dir, learner_url, plan))
        actor_url = role_url(url, server, "actor")
        keeper = IdKeeper(cfg, actor_url, run_dir, _say)
        ids = keeper.claim()
        announce_gpus(run_dir, plan, ids)
        roles.extend(spawn_actors(cfg, run_dir, model_dir, actor_url, ids, plan))
        code, reason = supervise(roles, "learner")
    except KeyboardInterrupt:
        code, reason = interrupted(keeper, "interrupted (Ctrl-C or SIGTERM); all roles stopped")
    finally:
        begin_shutdown()  # from here on a signal hurries the shutdown instead of breaking it
        stop_roles(roles)
        if keeper:
            keeper.close()
        if server:
            server.stop()
            write_run_info(run_dir, redis_restarts=server.restarts)
    return _report(run_dir, code, reason, record_restarts(run_dir, roles))


def check_network(cfg: Config) -> None:
    """This host holds ``network.bind`` (else ValueError listing its addresses); off loopback
    say what listens where and that every service authenticates."""
    from asyncrl.orchestration.launch import hostnet

    hostnet.check(cfg.network)
    if not cfg.network.local:
        net = cfg.network
        print(
            f"[asyncrl] network: binding {net.bind}, advertised as {net.address}: Redis "
            "(password, ACL users), the control plane (CURVE keys) and the weight group "
            "(no authentication: keep this address on the cluster network) are reachable "
            "from other hosts; metrics stay on loopback",
            flush=True,
        )


def check_rendezvous_host(cfg: Config) -> None:
    """Learner node 0 of several hosts the rendezvous store: ``learner.rdzv_endpoint``'s
    host must be this host's (else ValueError listing its addresses, before torchrun waits)."""
    from asyncrl.orchestration.launch import hostnet

    lc = cfg.learner
    if lc.nnodes > 1 and lc.node_rank == 0:
        host = lc.rdzv_endpoint.rsplit(":", 1)[0]
        try:
            hostnet.interface_name(hostnet.resolve(host))
        except ValueError as e:
            raise ValueError(
                f"learner.rdzv_endpoint={lc.rdzv_endpoint} on learner.node_rank=0: node 0 "
                f"serves the rendezvous, so its host must be this host's. {e}"
            ) from None


def check_reward_fn(cfg: Config) -> None:
    """Import ``task.reward_fn`` and check that it can be called as ``fn(prompt, completion,
    **fields)`` with the task's fields, so a wrong name or signature fails at once with the
    key named (the actors import and check the same function when they start)."""
    from asyncrl.actors.data.tasks import example_fields
    from asyncrl.actors.rewards.loading import check_signature, load_reward_fn, preflight

    fields = example_fields(cfg)  # a file task: its first record (bad data fails here)
    try:
        fn = load_reward_fn(cfg.task.reward_fn)
        check_signature(fn, fields, cfg.task.reward_fn)
    except ValueError as e:
        raise ValueError(f"task.reward_fn: {e}") from e
    preflight(fn)  # e.g. python_code_reward: can this machine sandbox model-written code?


def check_data(cfg: Config, model_dir: str) -> None:
    """Load the prompts as the actors will, so bad data fails before any process starts."""
    from asyncrl.actors.data.tasks import check_data as check

    check(cfg, model_dir, lambda text: print(f"[asyncrl] {text}", flush=True))


def _say(text: str) -> None:
    print(text, flush=True)


def _report(run_dir: Path, code: int, reason: str, restarts: dict[str, int] | None = None) -> int:
    restarted = {k: v for k, v in (restarts or {}).items() if v}
    if restarted:
        counts = ", ".join(f"{k} x{v}" for k, v in restarted.items())
        print(f"[asyncrl] restarts: {counts}", flush=True)
    if code:
        print(f"[asyncrl] FAILED: {reason}", flush=True)
        return code
    print(
        f"[asyncrl] done. summary: {run_dir / 'summary.json'}\n"
        f"[asyncrl] metrics: {run_dir / 'metrics.jsonl'}\n"
        f"[asyncrl] reward curve: {run_dir / 'reward.png'}",
        flush=True,
    )
    return 0


def launch_role(cfg: Config, role: str) -> int:
    """One role on this node group, against ``buffer.url`` (``buffer``: start that server)."""
    check_network(cfg)
    plan = plan_node(cfg, (role,))  # a refused GPU layout fails before anything starts
    if role == "learner":
        check_rendezvous_host(cfg)
    cores.resolve(cfg, sorted(os.sched_getaffinity(0)), both_sides=False)  # auto: unpinned
    run_dir = prepare_run_dir(cfg, (role,))
    if role == "buffer":
        return _serve_buffer(cfg, run_dir)
    if not cfg.buffer.url:
        raise ValueError(
            f"`asyncrl launch {role}` needs buffer.url_file=FILE, a file (mode 0600) holding "
            "redis://USER:PASSWORD@HOST:PORT/0 (`asyncrl launch buffer` writes one per role "
            "and prints where)"
        )
    start_buffer(cfg, run_dir)  # checks that the URL answers and may touch buffer.name's keys
    import_heavy_modules()
    if role == "actors":
        check_reward_fn(cfg)
    if role == "learner":
        check_available(cfg.logger)
    warn_model_settings(cfg)
    model_dir = resolve_model(cfg, weights=role == "learner" or cfg.actor.engine != "sim")
    if role == "actors":
        check_data(cfg, model_dir)
    write_run_info(run_dir, model_dir=model_dir, cores=core_split(cfg))
    url = cfg.buffer.url
    keeper = None
    roles: list[Role] = []
    try:
        if role == "learner":
            announce_gpus(run_dir, plan, [])
            roles.append(spawn_learner(cfg, run_dir, model_dir, url, plan))
        else:
            keeper = IdKeeper(cfg, url, run_dir, _say)
            ids = keeper.claim()
            _say(f"[asyncrl] actor ids {ids} of {cfg.actor.total} (buffer {cfg.buffer.name!r})")
            announce_gpus(run_dir, plan, ids)
            roles.extend(spawn_actors(cfg, run_dir, model_dir, url, ids, plan))
        serve_launcher_metrics(cfg, url, launcher_role(role, cfg.network), roles)
        code, reason = supervise(roles, roles[0].name)
    except KeyboardInterrupt:
        code, reason = interrupted(keeper, "interrupted (Ctrl-C or SIGTERM)")
    finally:
        begin_shutdown()
        stop_roles(roles)
        if keeper:
            keeper.close()
    restarts = record_restarts(run_dir, roles)
    if role == "learner" and cfg.learner.node_rank == 0:
        return _report(run_dir, code, reason, restarts)
    if role == "learner" and not code:
        print(
            f"[asyncrl] learner node {cfg.learner.node_rank} done; the run's summary and "
            "metrics are on learner node 0",
            flush=True,
        )
    if code:
        print(f"[asyncrl] FAILED: {reason}", flush=True)
    return code


def _serve_buffer(cfg: Config, run_dir: Path) -> int:
    server = _redis_server(cfg, run_dir).start()
    url_file = server.run_dir / "redis.url"
    print(
        f"[buffer] redis-server ready; its URL (with password) is in {url_file} (mode 0600)",
        flush=True,
    )
    print(
        f"[buffer] give each role its least-privilege ACL user's URL file (copy it to the "
        f"role's hosts, mode 0600): learner buffer.url_file={server.run_dir / 'redis.learner.url'}"
        f", actors buffer.url_file={server.run_dir / 'redis.actor.url'}",
        flush=True,
    )
    if server.tls is not None:
        print(
            f"[buffer] TLS only (no plain port); the URLs verify the server with "
            f"{server.tls.ca}: that file must be at the same path on every role's host",
            flush=True,
        )
    try:
        while server.running():
            time.sleep(1.0)
        print("[buffer] redis-server exited", flush=True)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        begin_shutdown()
        server.stop()
