"""The sandbox for model-written code (``asyncrl.actors.rewards.sandbox.run_untrusted``): a fork bomb, an
infinite loop, a socket connect and a write outside its directory are each contained,
reported with a reason, and finish within the test's bound. Real processes, real kernel."""

from __future__ import annotations

import os
import socket
import threading
import time

import psutil
import pytest

import asyncrl.actors.rewards.cgroup as sandbox_cgroup
import asyncrl.actors.rewards.sandbox as sandbox
from asyncrl.actors.rewards.sandbox import SandboxError, available_isolation, run_untrusted

FORK_BOMB = """
import os, time
while True:
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
    except OSError:
        pass
"""


_LAYERS: list[str] = []


def needs(*layers: str) -> None:
    """Skip, naming the kernel feature, where this machine lacks a layer the test checks (the
    code reward refuses to run there instead: ``test_missing_layers_refuse_to_run_the_code``)."""
    if not _LAYERS:
        _LAYERS.extend(available_isolation())
    missing = [layer for layer in layers if layer not in _LAYERS]
    if missing:
        pytest.skip(
            f"this kernel lacks sandbox layers {missing} (in force: {_LAYERS}): Landlock needs "
            "Linux >= 5.13 with it enabled, namespaces need unprivileged user namespaces"
        )


def _leftovers(workdir) -> list[int]:
    """Pids of processes still running in ``workdir`` (sandboxed code that escaped)."""
    out = []
    for p in psutil.process_iter(["cwd"]):
        if (p.info.get("cwd") or "").startswith(str(workdir)):
            out.append(p.pid)
    return out


def _cgroup_dirs():
    """This process's sandbox cgroups still on disk (none once run_untrusted returned)."""
    for base in sandbox_cgroup._own_pids_cgroups():
        yield from base.glob(f"asyncrl-sandbox-{os.getpid()}-*")


@pytest.mark.timeout(60)
def test_fork_bomb_is_contained_and_reaped(tmp_path):
    needs("pidns")
    work = tmp_path / "work"
    t0 = time.monotonic()
    r = run_untrusted(FORK_BOMB, timeout_s=20, cpu_s=5, mem_mb=256, workdir=work, max_procs=16)
    elapsed = time.monotonic() - t0
    assert not r.ok and r.reason.startswith("process limit"), r
    assert elapsed < 15, f"the bomb was stopped by the wall clock, not the process limit: {r}"
    if "cgroup" in r.isolation or os.geteuid() != 0:
        # The pids cgroup (or RLIMIT_NPROC, for a user other than root) refuses the 17th task,
        # the confining bootstrap included: the tree never holds more than 15.
        assert r.peak_procs <= 15, r.peak_procs
    # else: root without a writable cgroupfs: only the 10 ms watchdog limits the count, and a
    # bomb overshoots between two polls by as much as the box lets it (83 seen in CI).
    time.sleep(0.2)
    assert _leftovers(work) == [], "a sandboxed process outlived run_untrusted"
    assert not list(_cgroup_dirs()), "the sandbox's cgroup was left behind"


@pytest.mark.timeout(60)
def test_threads_count_against_the_cgroup_limit_and_its_cgroup_is_removed(tmp_path):
    """The pids cgroup binds root too: the 17th thread cannot start; the watchdog sees the
    refusal, kills the sandbox and names the limit. The cgroup is gone afterwards."""
    needs("cgroup")
    code = (
        "import threading, time\n"
        + "for _ in range(40):\n"
        + ("    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n")
    )
    r = run_untrusted(code, timeout_s=20, cpu_s=5, workdir=tmp_path / "w", max_procs=16)
    assert not r.ok and r.reason.startswith("process limit"), r
    assert r.duration_s < 15, r
    assert not list(_cgroup_dirs()), "the sandbox's cgroup was left behind"
    ok = run_untrusted(
        "import threading; t = threading.Thread(target=print); t.start()", max_procs=16
    )
    assert ok.ok and "cgroup" in ok.isolation, ok


@pytest.mark.timeout(90)
def test_infinite_loop_hits_the_cpu_limit(tmp_path):
    r = run_untrusted("while True:\n    pass\n", timeout_s=60, cpu_s=1, workdir=tmp_path / "w")
    assert not r.ok and r.reason.startswith("cpu limit"), r
    assert r.duration_s < 60


@pytest.mark.timeout(30)
def test_sleeping_loop_hits_the_wall_clock(tmp_path):
    code = "import time\nwhile True:\n    time.sleep(0.1)\n"
    r = run_untrusted(code, timeout_s=2, cpu_s=5, workdir=tmp_path / "w")
    assert not r.ok and r.reason.startswith("timeout"), r
    assert 2 <= r.duration_s < 10
    assert _leftovers(tmp_path / "w") == []


@pytest.mark.timeout(30)
def test_socket_connect_is_refused(tmp_path):
    """TCP to a real listener on loopback and UDP both fail; the listener sees nothing."""
    needs("netns")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(3)
    port = server.getsockname()[1]
    accepted = []
    t = threading.Thread(target=lambda: _accept(server, accepted), daemon=True)
    t.start()
    code = f"""
import socket
errors = []
try:
    s = socket.create_connection(("127.0.0.1", {port}), timeout=2)
    print("CONNECTED")
except OSError as e:
    errors.append(repr(e))
try:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.sendto(b"x", ("8.8.8.8", 53))
    print("UDP SENT")
except OSError as e:
    errors.append(repr(e))
print(errors)
raise SystemExit(3 if len(errors) == 2 else 0)
"""
    r = run_untrusted(code, timeout_s=20, workdir=tmp_path / "w")
    t.join()
    server.close()
    assert "CONNECTED" not in r.stdout and "UDP SENT" not in r.stdout, r
    assert r.returncode == 3 and r.reason.startswith("exit code 3"), r
    assert accepted == [], "the sandbox reached a loopback server"
    assert "netns" in r.isolation or "landlock" in r.isolation, r.isolation


def _accept(server: socket.socket, accepted: list) -> None:
    try:
        accepted.append(server.accept())
    except OSError:
        pass


@pytest.mark.timeout(30)
def test_write_outside_its_directory_is_denied(tmp_path):
    needs("landlock")
    work, outside = tmp_path / "work", tmp_path / "outside.txt"
    code = f"""
open("inside.txt", "w").write("ok")
open({str(outside)!r}, "w").write("escaped")
"""
    r = run_untrusted(code, timeout_s=20, workdir=work)
    assert not r.ok and r.reason.startswith("denied by the sandbox"), r
    assert str(outside) in r.reason
    assert not outside.exists()
    assert (work / "inside.txt").read_text() == "ok"
    assert "landlock" in r.isolation


@pytest.mark.timeout(30)
def test_no_secrets_reach_the_code(tmp_path, monkeypatch):
    """No environment variables of the caller, no reading the run directory or /proc."""
    needs("landlock")
    secret = tmp_path / "redis.conf"
    secret.write_text("requirepass hunter2\n")
    monkeypatch.setenv("ASYNCRL_REDIS_URL", "redis://:hunter2@127.0.0.1:1/0")
    code = f"""
import os
print(sorted(os.environ))
for path in ({str(secret)!r}, "/proc/1/environ", "/proc/{os.getpid()}/environ"):
    try:
        print(path, open(path).read())
    except OSError as e:
        print(path, "DENIED", type(e).__name__)
"""
    r = run_untrusted(code, timeout_s=20, workdir=tmp_path / "w")
    assert "hunter2" not in r.stdout and "ASYNCRL" not in r.stdout, r.stdout
    assert r.stdout.count("DENIED") == 3, r.stdout


@pytest.mark.timeout(30)
def test_memory_limit(tmp_path):
    r = run_untrusted("x = bytearray(1 << 30)\n", timeout_s=20, mem_mb=256, workdir=tmp_path / "w")
    assert not r.ok and r.reason.startswith("memory limit"), r


@pytest.mark.timeout(60)
def test_python_code_reward_runs_completions_in_the_sandbox():
    from asyncrl.actors.rewards.code_reward import CODE_REQUIRE

    needs(*CODE_REQUIRE)
    from asyncrl.actors.rewards.calls import score
    from asyncrl.actors.rewards.code_reward import python_code_reward

    good = "Here:\n```python\ndef add(a, b):\n    return a + b\n```"
    bad = "```python\ndef add(a, b):\n    return a - b\n```"
    escape = "```python\nimport socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)\n```"
    tests = "assert add(2, 3) == 5"
    assert score(python_code_reward, "p", good, {"tests": tests}) == (1.0, "")
    assert score(python_code_reward, "p", bad, {"tests": tests}) == (0.0, "")
    out = python_code_reward("p", escape, tests=tests)
    assert out["score"] == 0.0 and out["sandbox"], out


@pytest.mark.timeout(60)
def test_missing_layers_refuse_to_run_the_code(tmp_path, monkeypatch):
    """On a kernel without a required layer (acted out: the child reports it missing), the code
    never runs, ``SandboxError`` names the layer and the fix, and the code reward and the
    launcher's start-up check raise it instead of scoring samples 0."""
    from asyncrl.actors.rewards.calls import score
    from asyncrl.actors.rewards.code_reward import python_code_reward
    from asyncrl.core.config.job import Config
    from asyncrl.orchestration.launch.preflight import check_reward_fn

    monkeypatch.setattr(sandbox, "_TEST_WITHOUT", ("landlock",))
    work = tmp_path / "w"
    with pytest.raises(SandboxError, match=r"\['landlock'\] are not available.*not run"):
        run_untrusted("open('ran.txt', 'w').write('x')", require=("landlock",), workdir=work)
    assert not (work / "ran.txt").exists(), "the code ran although a required layer was missing"
    r = run_untrusted("open('ran.txt', 'w').write('x')", workdir=work)  # not required: runs
    assert r.ok and "landlock" not in r.isolation, r
    with pytest.raises(SandboxError, match="Landlock"):
        score(python_code_reward, "p", "print(1)", {"tests": ""})
    cfg = Config()
    cfg.task.reward_fn = "asyncrl.actors.rewards:python_code_reward"
    with pytest.raises(SandboxError, match="landlock"):
        check_reward_fn(cfg)
