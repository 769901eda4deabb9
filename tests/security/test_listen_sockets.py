"""A real `asyncrl run` listens on loopback (or unix sockets) only: Redis, the ZeroMQ control
plane, every Prometheus endpoint, torchrun's rendezvous store, the weight-sync store and gloo,
vLLM's internals. Roles connect to Redis as their least-privilege ACL user."""

from __future__ import annotations

import ipaddress
import re

import psutil
import pytest

from tests.e2e.conftest import needs_full_stack
from tests.roles import cmdline

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.redis]


def _job_pids(root: int) -> dict[int, str]:
    """pid -> name of the launcher and all its descendants (roles run in their own sessions
    but stay descendants)."""
    proc = psutil.Process(root)
    out = {root: proc.name()}
    for child in proc.children(recursive=True):
        try:
            out[child.pid] = child.name()
        except psutil.NoSuchProcess:
            continue
    return out


def _listeners(pids: dict[int, str]) -> list[tuple[str, int, int, str]]:
    """(ip, port, pid, name) of every listening TCP or bound UDP socket of ``pids``."""
    out = []
    for c in psutil.net_connections(kind="inet"):
        if c.pid not in pids or not c.laddr:
            continue
        tcp_listen = c.type == socket_stream() and c.status == psutil.CONN_LISTEN
        udp_bound = c.type != socket_stream() and not c.raddr
        if tcp_listen or udp_bound:
            out.append((c.laddr.ip, c.laddr.port, c.pid, pids[c.pid]))
    return out


def socket_stream() -> int:
    import socket

    return socket.SOCK_STREAM


def _loopback(ip: str) -> bool:
    return ipaddress.ip_address(ip.split("%")[0]).is_loopback


def _env(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.timeout(420)
def test_running_job_listens_on_loopback_only(tmp_path, roles):
    needs_full_stack()
    run_dir = tmp_path / "run"
    proc = roles.cli("run", "run", "experiment=tiny", "learner.steps=100000", f"run_dir={run_dir}")
    # the job runs until the test ends: the ``roles`` fixture stops it (Ctrl-C)
    roles.wait_until(lambda: re.search(r"^step ", proc.output(), re.M), 300, "the first step")
    out = proc.output()
    pids = _job_pids(proc.pid)
    listeners = _listeners(pids)
    exposed = [sock for sock in listeners if not _loopback(sock[0])]
    assert not exposed, f"listening beyond loopback: {exposed}"

    # Not vacuous: the endpoints the job announced are among the loopback listeners.
    ports = {port for _, port, _, _ in listeners}
    metrics = {int(p) for p in re.findall(r"metrics(?: on|:) http://127\.0\.0\.1:(\d+)/", out)}
    control = {int(p) for p in re.findall(r"control plane on tcp://127\.0\.0\.1:(\d+)", out)}
    redis_port = int((run_dir / "redis" / "redis.url").read_text().rsplit(":", 1)[1][:-3])
    assert len(metrics) >= 3 and control, out[-3000:]  # launcher, learner, actor0
    assert metrics | control | {redis_port} <= ports, (metrics, control, redis_port, ports)
    assert "redis-server" in {name for _, _, _, name in listeners}, listeners
    agents = [p for p in pids if "asyncrl.core.runtime.torchrun" in cmdline(p)]
    assert agents and any(pid in agents for _, _, pid, _ in listeners), (
        "torchrun's rendezvous store should be among the (loopback) listeners"
    )

    # Roles hold their ACL user's URL, never the admin's.
    admin = (run_dir / "redis" / "redis.url").read_text().strip()
    role_urls = [_env(p) for p in pids if "ASYNCRL_REDIS_URL=" in _env(p)]
    assert role_urls, "no role process found"
    assert not any(admin in env for env in role_urls), "a role holds the admin URL"
    users = {m for env in role_urls for m in re.findall(r"ASYNCRL_REDIS_URL=redis://(\w+):", env)}
    assert users == {"actor", "learner"}, users
