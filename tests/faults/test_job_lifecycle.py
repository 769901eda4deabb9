"""What a person or a machine does to a whole job: a second job in the same run
directory, a SIGKILLed launcher, two Ctrl-C in quick succession, a signal in the first
moments. Real launchers (``asyncrl run``, ``asyncrl launch buffer``) with the simulated
engine, a real redis-server and real learner ranks.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from asyncrl.core.runtime import rundir
from tests.faults.test_checkpoint_kills import pid_alive
from tests.faults.test_supervision import procs_mentioning

pytestmark = [pytest.mark.faults, pytest.mark.redis, pytest.mark.slow]

SIM = ("actor.engine=sim", "actor.sim_tokens_per_s=500", "experiment=tiny", "metrics_port=0")


def _start_job(roles, run_dir, name="job"):
    job = roles.cli(name, "run", *SIM, "learner.steps=100000", "learner.nproc=1",
                    f"run_dir={run_dir}")  # fmt: skip
    roles.wait_until(lambda: re.search(r"^step +1 \|", job.output(), re.M), 300, "a first step")
    return job


def _job_procs(run_dir) -> list[str]:
    """Live processes of a job: command lines naming ``run_dir``, and the holders of its
    locks (redis-server rewrites its command line, but holds the buffer lock), or a lock
    still held whose holder the scan no longer sees."""
    locks = list(run_dir.glob(".lock-*"))
    holders = {pid for lock in locks for pid in rundir._pids_holding(lock)}
    named = [f"{pid}: {_comm(pid)}" for pid in sorted(holders) if _comm(pid)]
    # a process in its exit has closed its descriptors (gone from the /proc scan) a moment
    # before the kernel drops its lock (seen once in 6 runs): the job is gone only then
    held = [f"{lock.name} still held" for lock in locks
            if rundir.in_use(run_dir, lock.name.removeprefix(".lock-"))]  # fmt: skip
    return procs_mentioning(str(run_dir)) + named + ([] if named else held)


def _comm(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/comm").read().strip()
    except OSError:
        return ""


def _log_tails(run_dir, chars: int = 3000) -> str:
    """The last output of each role's log (what a process that outlived the job was doing)."""
    return "\n".join(f"--- {p.name}:\n{p.read_text(errors='replace')[-chars:]}"
                     for p in sorted(run_dir.glob("*.log")))  # fmt: skip


def _redis_alive(run_dir) -> bool:
    return any("redis-server" in p for p in _job_procs(run_dir))


def _gone(run_dir, timeout_s: float) -> list[str]:
    """Processes of the job still alive after up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (left := _job_procs(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.timeout(400)
def test_a_second_job_in_a_busy_run_dir_is_refused_and_a_killed_job_frees_it(tmp_path, roles):
    run_dir = tmp_path / "run"
    first = _start_job(roles, run_dir)
    url = (run_dir / "redis" / "redis.url").read_text()
    config = (run_dir / "config.json").read_text()

    second = roles.cli("second", "run", *SIM, "learner.steps=3", f"run_dir={run_dir}")
    assert roles.wait(second, 30) == 1, second.tail()
    out = second.output()
    assert f"run_dir={run_dir} is in use" in out, out
    assert f"PID {first.pid}" in out, out  # names the job that holds it
    assert "Traceback" not in out, out
    # the second job touched nothing of the first: its Redis, its config
    assert (run_dir / "redis" / "redis.url").read_text() == url
    assert (run_dir / "config.json").read_text() == config
    assert len([p for p in _job_procs(run_dir) if "redis-server" in p]) == 1

    # SIGKILL of the launcher: its roles and redis-server die with it (asyncrl/core/runtime/lifeline.py)
    assert _redis_alive(run_dir), "the check below would be vacuous"
    roles.kill(first)
    left = _gone(run_dir, 60)
    assert not left, f"processes outlived the SIGKILLed launcher: {left}\n{_log_tails(run_dir)}"
    # ...and the kernel dropped the lock with them: a new job may take the directory
    take = (
        "from asyncrl.core.runtime import rundir; import sys; "
        "rundir.prepare(sys.argv[1], ('buffer', 'learner', 'actors')); print('locked')"
    )
    res = subprocess.run([sys.executable, "-c", take, str(run_dir)], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0 and "locked" in res.stdout, res.stderr


@pytest.mark.timeout(300)
def test_roles_whose_redis_died_first_leave_within_seconds_of_a_launcher_sigkill(tmp_path, roles):
    """Redis gone first, then the launcher SIGKILLed: the roles, retrying Redis for
    buffer.reconnect_s (60 s), get SIGTERM from the kernel and must not finish that budget
    (CI of stop 21: both outlived the launcher by 60 s when Redis won the race)."""
    run_dir = tmp_path / "run"
    job = _start_job(roles, run_dir)
    roles.release(job)
    redis_pids = [int(p.split(":")[0]) for p in _job_procs(run_dir) if p.endswith("redis-server")]
    assert len(redis_pids) == 1, _job_procs(run_dir)
    os.kill(job.pid, signal.SIGSTOP)  # no restart of Redis by the launcher
    os.kill(redis_pids[0], signal.SIGKILL)
    time.sleep(3.0)  # the roles are in their reconnect retries now
    roles.kill(job)
    left = _gone(run_dir, 15)
    assert not left, f"processes outlived the SIGKILLed launcher by 15s: {left}"


@pytest.mark.timeout(300)
def test_two_ctrl_c_within_0_2s_still_stop_redis_cleanly(tmp_path, roles):
    run_dir = tmp_path / "run"
    job = _start_job(roles, run_dir)
    assert _redis_alive(run_dir), "the check below would be vacuous"
    roles.release(job)
    t0 = time.monotonic()
    job.popen.send_signal(signal.SIGINT)
    time.sleep(0.1)
    job.popen.send_signal(signal.SIGINT)
    code = job.popen.wait(60)
    took = time.monotonic() - t0
    out = job.output()
    assert code == 130, out[-3000:]
    assert "already stopping" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert took < 30, f"stopping took {took:.1f}s"
    assert not _gone(run_dir, 10), "processes outlived the job"
    redis_log = (run_dir / "redis" / "redis.log").read_text()
    assert "ready to exit, bye bye" in redis_log.splitlines()[-1], redis_log[-1000:]


@pytest.mark.timeout(300)
def test_a_ctrl_c_to_the_whole_process_group_stops_redis_last(tmp_path, roles):
    """A terminal's Ctrl-C (or `timeout`, a batch scheduler) signals the launcher's
    whole process group; redis-server shared it, died first, and was restarted by the buffer
    supervisor in the middle of the shutdown, so no summary.json was written. Now it runs in
    a session of its own and the launcher stops it after the roles."""
    run_dir = tmp_path / "run"
    job = _start_job(roles, run_dir)
    import psutil

    holders = rundir._pids_holding(run_dir / ".lock-buffer")
    (redis,) = [p for p in holders if psutil.Process(p).name().startswith("redis-server")]
    assert os.getpgid(redis) != os.getpgid(job.popen.pid), "redis-server in the job's group"
    roles.release(job)
    os.killpg(job.popen.pid, signal.SIGINT)
    code = job.popen.wait(60)
    out = job.output()
    assert code == 130, out[-3000:]
    assert "Traceback" not in out and "restart" not in out.lower(), out[-3000:]
    assert (run_dir / "summary.json").is_file(), out[-3000:]
    redis_log = (run_dir / "redis" / "redis.log").read_text()
    assert "ready to exit, bye bye" in redis_log.splitlines()[-1], redis_log[-1000:]
    assert not _gone(run_dir, 10), "processes outlived the job"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_in_the_first_moments_stops_without_a_traceback(tmp_path, roles, sig):
    for i, delay in enumerate((0.1, 0.6, 1.5, 3.0)):
        run_dir = tmp_path / f"run{i}"
        job = roles.cli(f"job{i}", "run", *SIM, "learner.steps=100000", f"run_dir={run_dir}")
        roles.release(job)
        time.sleep(delay)
        job.popen.send_signal(sig)
        code = job.popen.wait(60)
        out = job.output()
        # 130 once our handler is installed; a signal before Python runs our code at all
        # (interpreter start-up) ends it the default way
        assert code in (130, -sig), f"{delay}s: exit {code}\n{out[-3000:]}"
        assert "Traceback" not in out, f"{delay}s:\n{out[-3000:]}"
        assert not _gone(run_dir, 30), f"{delay}s: processes outlived the job"


@pytest.mark.timeout(120)
def test_a_sigkilled_buffer_launcher_takes_its_redis_server_with_it(tmp_path, roles):
    run_dir = tmp_path / "buffer"
    buffer = roles.cli("buffer", "launch", "buffer", f"run_dir={run_dir}")
    roles.wait_line(buffer, "redis-server ready", 60)
    pid = json.loads((run_dir / ".lock-buffer").read_text())["pid"]
    assert pid == buffer.pid
    assert _redis_alive(run_dir), "the check below would be vacuous"
    roles.kill(buffer)
    assert not _gone(run_dir, 20), "redis-server outlived `asyncrl launch buffer`"


def _role_pid(run_dir, module: str) -> int:
    """The PID of the role ``python -m MODULE --run-dir RUN_DIR`` (a learner rank, not the
    ``asyncrl.core.runtime.torchrun`` that started it)."""
    import psutil

    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if module in cmd and str(run_dir) in cmd and "asyncrl.core.runtime.torchrun" not in cmd:
            return p.pid
    raise AssertionError(f"no `-m {module}` process of {run_dir}")


@pytest.mark.timeout(300)
def test_a_learner_stopped_while_its_weight_ack_waits_on_a_stuck_actor_leaves_in_seconds(
    tmp_path, roles
):
    """The actor stalls for 20 s before its 3rd weight receive (a failpoint: it holds the
    weight group's sockets open but does not join the collective); SIGTERM the learner
    then. Its deferred ack (``learner.defer_weight_ack``) is abandoned and the group closed
    without waiting for that collective (CI of stop 24: a learner outlived its SIGKILLed
    launcher by over 60 s; destroying a gloo group under a running collective blocks until
    the collective ends)."""
    run_dir, trace = tmp_path / "run", tmp_path / "receive.jsonl"
    points = f"actor.before_weight_receive=trace:{trace}@3,actor.before_weight_receive=sleep:20@3"
    job = roles.cli("job", "run", *SIM, "learner.steps=100000", "learner.nproc=1",
                    f"run_dir={run_dir}", env={"ASYNCRL_FAILPOINTS": points})  # fmt: skip
    roles.wait_until(trace.is_file, 300, "the actor's stall before its 3rd weight receive")
    roles.release(job)
    time.sleep(1.0)  # the learner's ack thread is in the collective the actor did not join
    learner = _role_pid(run_dir, "asyncrl.learner.main")
    t0 = time.monotonic()
    os.kill(learner, signal.SIGTERM)
    while pid_alive(learner) and time.monotonic() - t0 < 60:
        time.sleep(0.1)
    took = time.monotonic() - t0
    log = (run_dir / "learner.log").read_text(errors="replace")[-3000:]
    assert took < 10, f"the learner took {took:.0f}s to leave after SIGTERM\n{log}"
    assert "summary" in log, log  # it finished its run, it was not killed
