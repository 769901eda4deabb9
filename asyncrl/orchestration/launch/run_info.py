"""The run directory as a launch keeps it, and what the launch says about the run:

    config.json, config.yaml   the resolved config, written once (``prepare_run_dir``)
    run.json                   what the launcher resolved and saw: model directory, core split,
                               GPU placement, restarts per role (``write_run_info``; no secrets)

and the last lines a launch prints (``report``, ``report_role``). ``summary.json`` and
``metrics.jsonl`` are the learner's alone (one writer per file).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from asyncrl.core.config.job import Config
from asyncrl.core.config.load import config_to_json, config_to_yaml
from asyncrl.core.runtime import rundir
from asyncrl.orchestration.launch.launcher import Role
from asyncrl.orchestration.launch.resume_config import check_resume
from asyncrl.orchestration.placement.plan import Plan

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


def core_split(cfg: Config) -> str:
    """One line: the cores available and how the learner's and actors' threads use them."""
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


def announce_gpus(run_dir: Path, plan: Plan, actor_ids: list[int]) -> None:
    """Print the plan once and record it in ``run.json`` (nothing for a CPU run)."""
    if not plan.empty:
        say(f"[asyncrl] {plan.describe(actor_ids)}")
        write_run_info(run_dir, gpus=plan.by_role(actor_ids))


def record_restarts(run_dir: Path, roles: list[Role]) -> dict[str, int]:
    """Restarts per role, into ``run.json`` (the launcher's record; ``summary.json`` is the
    learner's alone), with what each role's log lost to rotation and how many of its lines
    were cut in memory and on the console (launcher.py, role_log.py)."""
    restarts = {r.name: r.restarts for r in roles}
    write_run_info(
        run_dir,
        role_restarts=restarts,
        role_log_deleted_bytes={r.name: r.log_deleted_bytes for r in roles},
        role_lines_cut={r.name: r.cut_lines for r in roles},
    )
    return restarts


def report(run_dir: Path, code: int, reason: str, restarts: dict[str, int] | None = None) -> int:
    """The end of a run: its restarts, then FAILED with ``reason`` or where its results are;
    returns ``code``."""
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


def report_role(
    cfg: Config, role: str, run_dir: Path, code: int, reason: str, restarts: dict[str, int]
) -> int:
    """The end of a launched role: learner node 0 reports the run (``report``); another
    learner node points there; any role that failed says why. Returns ``code``."""
    if role == "learner" and cfg.learner.node_rank == 0:
        return report(run_dir, code, reason, restarts)
    if role == "learner" and not code:
        print(
            f"[asyncrl] learner node {cfg.learner.node_rank} done; the run's summary and "
            "metrics are on learner node 0",
            flush=True,
        )
    if code:
        print(f"[asyncrl] FAILED: {reason}", flush=True)
    return code


def say(text: str) -> None:
    print(text, flush=True)
