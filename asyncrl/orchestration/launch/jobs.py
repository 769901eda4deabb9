"""What ``asyncrl run`` and ``asyncrl launch <role>`` do, top to bottom.

``asyncrl run`` (``run_local``) starts one machine's processes in this order; each step
begins when the one above it has returned, so a check that fails leaves nothing running
(starting a process does not wait for it: the table below says what each one waits for)::

    asyncrl run: this process, the launcher
     │ preflight.py    one node; network.bind; GPU plan; cores     a refused layout: no run_dir
     │ run_info.py     <run_dir> made and locked; config.json, config.yaml
     │ preflight.py    reward fn, tracker, model (demo: warm start), data      still no process
     │
     ├─▶ redis-server          buffer_start.py: private, in <run_dir>/redis; the launcher
     │                         waits until it answers PING, then restarts it from its AOF
     │                         whenever it dies (with buffer.url: that server, checked instead)
     ├── launcher /metrics     roles.py: recorded in the buffer's endpoints
     ├─▶ learner               roles.py: torchrun -m asyncrl.learner.main, N ranks
     │ actor ids               actor_ids.py: claimed in the buffer (waits for free ones)
     ├─▶ actor0..actorK-1      roles.py: python -m asyncrl.actors.main, one per claimed id
     │
     │ supervise               launcher.py: until the learner exits 0; a role that dies is
     │                         restarted (*.restart_max) or fails the job
     ▼ stop                    roles.py Started: roles (SIGTERM), actor ids, redis-server
                               (SHUTDOWN); run.json; the report (run_info.py)

What each started process waits for::

    process        before its loop                         in its loop
    redis-server   nothing                                 its clients' commands
    learner        rank 0 claims the buffer for this run   a step's groups from the buffer
                   and announces its control plane in it   (written by the actors)
    actor i        its engine, then the learner's          a free slot in the buffer (a lease;
                   announcement (actor.learner_wait_s)     freed as the learner takes groups);
                                                           weights come from learner rank 0

    actors ──groups (Redis Streams, Arrow)──▶ buffer ──▶ learner
    learner rank 0 ◀──ZeroMQ control + weight collective──▶ actors

``asyncrl launch <role>`` (``launch_role``) runs one role of a job spread over node groups,
with the same steps, against ``buffer.url``::

    launch buffer     placement checks, run_dir, redis-server until Ctrl-C (serve_buffer)
    launch learner    placement checks, run_dir, buffer.url checked, inputs checked, learner
    launch actors     placement checks, run_dir, buffer.url checked, inputs checked,
                      actor ids, actors
"""

from __future__ import annotations

from asyncrl.core.config.job import Config
from asyncrl.core.net.endpoints import launcher_role
from asyncrl.orchestration.launch import preflight
from asyncrl.orchestration.launch.actor_ids import IdKeeper, interrupted
from asyncrl.orchestration.launch.buffer_start import role_url, serve_buffer, start_buffer
from asyncrl.orchestration.launch.launcher import supervise
from asyncrl.orchestration.launch.roles import (
    Started,
    serve_launcher_metrics,
    spawn_actors,
    spawn_learner,
)
from asyncrl.orchestration.launch.run_info import (
    announce_gpus,
    core_split,
    prepare_run_dir,
    record_restarts,
    report,
    report_role,
    say,
    write_run_info,
)
from asyncrl.orchestration.launch.stop_signals import import_heavy_modules

BOTH_ROLES = ("learner", "actors")


def run_local(cfg: Config) -> int:
    """Everything on this machine: buffer, learner (torchrun) and actors; returns an exit code."""
    preflight.check_one_node(cfg)
    plan, pinned = preflight.check_placement(cfg, BOTH_ROLES)  # before anything
    run_dir = prepare_run_dir(cfg)
    say(f"[asyncrl] run dir {run_dir}\n[asyncrl] {core_split(cfg)}")
    if pinned:
        say(f"[asyncrl] {pinned}")
    # a stop during torch's import takes effect after it
    import_heavy_modules(preflight.heavy_modules(cfg, BOTH_ROLES))
    model_dir = preflight.check_inputs(cfg, BOTH_ROLES, plan)  # before any process starts
    job = Started()
    try:
        url, job.server = start_buffer(cfg, run_dir)
        write_run_info(run_dir, model_dir=model_dir, cores=core_split(cfg))
        serve_launcher_metrics(cfg, url, "launcher", job.roles, job.server)
        learner_url = role_url(url, job.server, "learner")
        job.roles.append(spawn_learner(cfg, run_dir, model_dir, learner_url, plan))
        actor_url = role_url(url, job.server, "actor")
        job.keeper = IdKeeper(cfg, actor_url, run_dir, say)
        ids = job.keeper.claim()
        announce_gpus(run_dir, plan, ids)
        job.roles.extend(spawn_actors(cfg, run_dir, model_dir, actor_url, ids, plan))
        code, reason = supervise(job.roles, "learner")
    except KeyboardInterrupt:
        code, reason = interrupted(job.keeper, "interrupted (Ctrl-C or SIGTERM); all roles stopped")
    finally:
        job.stop(run_dir)
    return report(run_dir, code, reason, record_restarts(run_dir, job.roles))


def launch_role(cfg: Config, role: str) -> int:
    """One role on this node group, against ``buffer.url`` (``buffer``: start that server)."""
    plan, _ = preflight.check_placement(cfg, (role,))  # auto cores: unpinned
    run_dir = prepare_run_dir(cfg, (role,))
    if role == "buffer":
        return serve_buffer(cfg, run_dir)
    preflight.check_buffer_url(cfg, role)
    start_buffer(cfg, run_dir)  # checks that the URL answers and may touch buffer.name's keys
    import_heavy_modules(preflight.heavy_modules(cfg, (role,)))
    model_dir = preflight.check_inputs(cfg, (role,), plan)
    write_run_info(run_dir, model_dir=model_dir, cores=core_split(cfg))
    url = cfg.buffer.url
    job = Started()
    try:
        if role == "learner":
            announce_gpus(run_dir, plan, [])
            job.roles.append(spawn_learner(cfg, run_dir, model_dir, url, plan))
        else:
            job.keeper = IdKeeper(cfg, url, run_dir, say)
            ids = job.keeper.claim()
            say(f"[asyncrl] actor ids {ids} of {cfg.actor.total} (buffer {cfg.buffer.name!r})")
            announce_gpus(run_dir, plan, ids)
            job.roles.extend(spawn_actors(cfg, run_dir, model_dir, url, ids, plan))
        serve_launcher_metrics(cfg, url, launcher_role(role, cfg.network), job.roles)
        code, reason = supervise(job.roles, job.roles[0].name)
    except KeyboardInterrupt:
        code, reason = interrupted(job.keeper, "interrupted (Ctrl-C or SIGTERM)")
    finally:
        job.stop(run_dir)
    return report_role(cfg, role, run_dir, code, reason, record_restarts(run_dir, job.roles))
