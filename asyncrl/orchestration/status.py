"""``asyncrl status``: one screen about a running job, from its buffer and metrics endpoints.

    asyncrl status buffer.url_file=FILE [buffer.name=NAME]   (FILE holds the Redis URL)
    asyncrl status run_dir=runs/<timestamp>        (a job started by `asyncrl run`)

Buffer counters come from Redis; every process's ``/metrics`` endpoint is listed in the
buffer's ``<name>:endpoints`` hash (``asyncrl/core/net/endpoints.py``). The endpoints of this host are
scraped twice, ``_WINDOW_S`` apart, so rates (groups/s, tokens/s) and time fractions (busy,
waiting, paused) are over that window. An endpoint on another host listens on that host's
loopback (``/metrics`` has no authentication), so it is not scraped: its line names the host
(run ``asyncrl status`` there) and what Redis knows of it (an actor's live leases). A role's
first line ends with its GPUs: the ``CUDA_VISIBLE_DEVICES`` it registered with its endpoint
(the launcher's GPU plan, asyncrl/orchestration/placement/plan.py; a role outside the plan, e.g. a CPU learner,
shows what it inherited from its launcher, if anything).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from asyncrl.core.config.job import Config
from asyncrl.core.net.endpoints import Endpoint, Place, read_endpoints

_WINDOW_S = 2.0
_TIMEOUT_S = 2.0

Sample = dict[tuple[str, tuple], float]  # (name, sorted label items) -> value


def scrape(address: str, timeout_s: float = _TIMEOUT_S) -> Sample | None:
    """All samples of ``http://address/metrics``; None if it does not answer."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout_s) as r:
            text = r.read().decode()
    except OSError:
        return None
    out: Sample = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def job_url(cfg: Config) -> str:
    """``buffer.url``, or the private Redis URL a local ``asyncrl run`` wrote in its run dir."""
    if cfg.buffer.url:
        return cfg.buffer.url
    if not cfg.run_dir:
        raise ValueError(
            "asyncrl status needs buffer.url_file=FILE (a file holding the job's Redis URL), or "
            "run_dir=<the run directory of a local `asyncrl run`>"
        )
    path = Path(cfg.run_dir) / "redis" / "redis.url"
    if not path.is_file():
        raise ValueError(
            f"run_dir={cfg.run_dir} has no redis/redis.url: not the directory of an "
            "`asyncrl run` job (or of `asyncrl launch buffer`)"
        )
    return path.read_text().strip()


def print_status(cfg: Config) -> int:
    ended = _ended_run(cfg)
    print(ended if ended is not None else render_status(cfg))
    return 0


def _ended_run(cfg: Config) -> str | None:
    """For ``run_dir=`` of a job that is not running (no process holds its buffer lock): what
    it left behind, instead of waiting for a buffer that is gone. None while it runs."""
    from asyncrl.core.runtime import rundir

    if cfg.buffer.url or not cfg.run_dir:
        return None
    run_dir = Path(cfg.run_dir).expanduser()
    if not run_dir.is_dir():
        raise ValueError(f"run_dir={cfg.run_dir} does not exist; give the directory of a job")
    if rundir.in_use(run_dir, "buffer"):
        return None
    summary = run_dir / "summary.json"
    try:
        data = json.loads(summary.read_text())
    except (OSError, ValueError):
        return (
            f"the job in {run_dir} is not running and left no summary.json (it was stopped "
            f"or failed before its end): see {run_dir}/learner.log; resume it with "
            f"`asyncrl run run_dir={run_dir}` and the same overrides"
        )
    lines = [f"the job in {run_dir} has ended; its summary ({summary}):"]
    for key, value in data.items():  # the scalars; the file has the breakdowns
        if isinstance(value, int | float | str) and key != "title":
            lines.append(f"  {key}: {round(value, 4) if isinstance(value, float) else value}")
    return "\n".join(lines)


def render_status(cfg: Config, window_s: float = _WINDOW_S) -> str:
    from asyncrl.buffer.connection import connect, mask_url
    from asyncrl.buffer.redis_buffer import BufferOptions, ReplayBuffer

    url, name = job_url(cfg), cfg.buffer.name
    client = connect(url)
    # the job's own capacity: constructing ReplayBuffer with ours would overwrite it
    capacity = int(client.hget(f"{name}:meta", "capacity") or cfg.buffer.capacity)
    buf = ReplayBuffer(client, name, capacity, BufferOptions(lease_ttl_s=cfg.buffer.lease_ttl_s))
    stats, meta, leases = buf.stats(), buf.meta(), buf.leases_by_actor()
    endpoints = sorted(read_endpoints(client, name).values(), key=lambda e: _role_order(e.role))
    here = Place.here()
    local = [e for e in endpoints if e.scrapable_from(here)]
    first = {e.role: scrape(e.metrics) for e in local}
    if local:
        time.sleep(window_s)
    second = {e.role: scrape(e.metrics) for e in local}
    lines = [
        f"job {name!r} at {mask_url(url)}: mode {meta.get('mode', '?')}, max_staleness "
        f"{meta.get('max_staleness', '?')}, learner version {meta.get('learner_version', '?')}",
        f"buffer    unread {stats['unread']}/{stats['capacity']}  leased {stats['leased']}  "
        f"pending {stats['pending']}  committed {stats['committed']}  trained "
        f"{stats['trained']}  dropped stale {stats['dropped_stale']} invalid "
        f"{stats['dropped_invalid']} poison {stats.get('dropped_poison', 0)} uniform "
        f"{stats.get('dropped_uniform', 0)}",
    ]
    for e in endpoints:
        if e.role in first:
            block = _endpoint_lines(e, first[e.role], second[e.role], window_s)
        else:
            block = [_elsewhere(e, here, leases)]
        block[0] += _on_gpus(e.gpus)
        lines += block
    if not endpoints:
        lines.append("no metrics endpoints registered (metrics_port=0?)")
    return "\n".join(lines)


def _on_gpus(gpus: str) -> str:
    """``; on GPUs 2,3`` for a role whose ``CUDA_VISIBLE_DEVICES`` is ``2,3``; '' for none."""
    if not gpus:
        return ""
    return f"; on GPU{'s' if ',' in gpus else ''} {gpus}"


def _endpoint_lines(e: Endpoint, a: Sample | None, b: Sample | None, dt: float) -> list[str]:
    """The lines of a role scraped here (``a``, ``b``: its samples ``dt`` apart)."""
    if a is None or b is None:
        return [f"{e.role:9s} [{e.metrics}] not answering (finished or unreachable)"]
    kind = _label(b, "asyncrl_process_info", "role")
    render = {"learner": _learner, "actor": _actor}.get(kind, _launcher)
    return render(e.role, e.metrics, a, b, dt)


def _elsewhere(e: Endpoint, here: Place, leases: dict[int, int]) -> str:
    """The line of a role on another host: where it is, and what Redis says of it."""
    where = e.place.describe()
    if e.place.host == here.host:  # the same name, another loopback
        where += " in another network namespace"
    actor = e.role.removeprefix("actor")
    facts = f"{leases.get(int(actor), 0)} group(s) leased now; " if actor.isdigit() else ""
    return (
        f"{e.role:9s} on {where}, pid {e.pid}: {facts}run `asyncrl status` on that host for "
        "its rates"
    )


def _role_order(role: str) -> tuple:
    """launcher(s), learner, then actors by number."""
    digits = role.lstrip("abcdefghijklmnopqrstuvwxyz-")
    kind = 0 if role.startswith("launcher") else 1 if role == "learner" else 2
    return (kind, int(digits) if digits.isdigit() else 0, role)


def _v(s: Sample, name: str, **labels) -> float:
    return s.get((name, tuple(sorted(labels.items()))), 0.0)


def _label(s: Sample, name: str, label: str) -> str:
    for (n, labels), _ in s.items():
        if n == name:
            return dict(labels).get(label, "")
    return ""


def _rate(a: Sample, b: Sample, name: str, dt: float) -> float:
    return (_v(b, name) - _v(a, name)) / dt


def _by_label(s: Sample, name: str, label: str) -> dict[str, float]:
    return {dict(lb)[label]: v for (n, lb), v in s.items() if n == name and label in dict(lb)}


def _fractions(a: Sample, b: Sample, name: str) -> str:
    """``state pct%`` over the window, from a ``..._time_seconds_total{state}`` counter."""
    before, after = _by_label(a, name, "state"), _by_label(b, name, "state")
    delta = {k: after[k] - before.get(k, 0.0) for k in after if k != "starting"}
    total = sum(delta.values()) or 1.0
    return "  ".join(f"{k} {100 * d / total:.0f}%" for k, d in delta.items())


def _learner(role: str, addr: str, a: Sample, b: Sample, dt: float) -> list[str]:
    steps = _rate(a, b, "asyncrl_learner_steps_total", dt)
    groups = _rate(a, b, "asyncrl_learner_groups_trained_total", dt)
    tokens = _rate(a, b, "asyncrl_learner_tokens_trained_total", dt)
    hist = _by_label(b, "asyncrl_learner_trained_staleness_versions_bucket", "le")
    cum, prev, parts = sorted((float(k), v) for k, v in hist.items()), 0.0, []
    for le, count in cum:
        if count > prev and le != float("inf"):
            parts.append(f"{le:g}: {count - prev:.0f}")
        prev = count
    drops = _by_label(b, "asyncrl_learner_groups_dropped_total", "reason")
    syncs = _v(b, "asyncrl_learner_weight_sync_seconds_count") or 1.0
    sync_s = _v(b, "asyncrl_learner_weight_sync_seconds_sum") / syncs
    sync_mb = _v(b, "asyncrl_learner_weight_sync_bytes_total") / syncs / 1e6
    return [
        f"{role:9s} [{addr}] v{_v(b, 'asyncrl_learner_version'):.0f}  {steps:.2f} steps/s  "
        f"trained {groups:.1f} groups/s {tokens:.0f} tok/s  reward "
        f"{_v(b, 'asyncrl_learner_reward'):.3f}",
        f"{'':9s} time: {_fractions(a, b, 'asyncrl_learner_time_seconds_total')}",
        f"{'':9s} trained staleness {{{', '.join(parts)}}}  dropped "
        + " ".join(f"{k} {v:.0f}" for k, v in sorted(drops.items())),
        f"{'':9s} IS weight mean {_v(b, 'asyncrl_learner_is_weight_mean'):.3f} max "
        f"{_v(b, 'asyncrl_learner_is_weight_max'):.3f} ess "
        f"{_v(b, 'asyncrl_learner_is_ess_ratio'):.3f}  approx KL(behave) "
        f"{_v(b, 'asyncrl_learner_approx_kl_behave'):.4f}  weight sync {sync_s:.3f} s, "
        f"{sync_mb:.1f} MB each",
    ]


def _actor(role: str, addr: str, a: Sample, b: Sample, dt: float) -> list[str]:
    groups = _rate(a, b, "asyncrl_actor_groups_generated_total", dt)
    tokens = _rate(a, b, "asyncrl_actor_tokens_generated_total", dt)
    return [
        f"{role:9s} [{addr}] weights v{_v(b, 'asyncrl_actor_weight_version'):.0f}  generated "
        f"{groups:.1f} groups/s {tokens:.0f} tok/s  in flight "
        f"{_v(b, 'asyncrl_actor_inflight_groups'):.0f}",
        f"{'':9s} time: {_fractions(a, b, 'asyncrl_actor_time_seconds_total')}",
    ]


def _launcher(role: str, addr: str, a: Sample, b: Sample, dt: float) -> list[str]:
    up = _by_label(b, "asyncrl_launcher_role_up", "role")
    roles = ", ".join(f"{r} {'up' if v else 'exited'}" for r, v in up.items())
    return [f"{role:9s} [{addr}] roles: {roles or 'none'}"]
