"""``asyncrl.orchestration.launch.launcher.supervise`` with real (tiny) child processes: failures name the role and
how it ended; ``restart_max`` restarts a dead role with a backoff and counts it."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from asyncrl.orchestration.launch import launcher
from asyncrl.orchestration.launch.launcher import Role, describe_exit, spawn, stop_roles, supervise


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(launcher, "_BACKOFF_S", (0.01, 0.05))


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def role(tmp_path, name: str, code: str, restart_max: int = 0) -> Role:
    r = spawn(name, py(code), {}, tmp_path, lambda line: False)
    r.restart_max, r.restart_key = restart_max, "actor.restart_max"
    return r


def test_describe_exit_names_the_signal():
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(3) == "exited with code 3"


@pytest.mark.timeout(60)
def test_a_dead_role_fails_the_job_and_says_how_to_allow_restarts(tmp_path):
    roles = [
        role(tmp_path, "learner", "import time; time.sleep(30)"),
        role(tmp_path, "actor0", "print('boom'); raise SystemExit(3)"),
    ]
    try:
        code, reason = supervise(roles, "learner")
    finally:
        stop_roles(roles)
    assert code == 3
    assert reason.startswith("actor0 exited with code 3 (set actor.restart_max=N")
    assert "boom" in reason  # the tail of the role's log


@pytest.mark.timeout(60)
def test_restarts_up_to_restart_max_then_fails_counting_each(tmp_path, capsys):
    marker = tmp_path / "starts"
    crash = f"open({str(marker)!r}, 'a').write('x'); raise SystemExit(5)"
    roles = [
        role(tmp_path, "learner", "import time; time.sleep(30)"),
        role(tmp_path, "actor0", crash, restart_max=2),
    ]
    try:
        code, reason = supervise(roles, "learner")
    finally:
        stop_roles(roles)
    assert code == 5
    assert roles[1].restarts == 2 and marker.read_text() == "xxx"  # 1 start + 2 restarts
    assert "after 2 restart(s) (actor.restart_max=2 used up)" in reason
    out = capsys.readouterr().out
    assert out.count("actor0 exited with code 5; restarting it") == 2


@pytest.mark.timeout(60)
def test_a_restarted_role_that_then_succeeds_lets_the_job_succeed(tmp_path):
    marker = tmp_path / "crashed"
    once = (
        f"import os, sys\nif not os.path.exists({str(marker)!r}):\n"
        f"    open({str(marker)!r}, 'w').close(); sys.exit(9)\n"
    )
    roles = [
        role(tmp_path, "actor0", once, restart_max=1),
        role(tmp_path, "learner", "import time; time.sleep(1.5)"),
    ]
    try:
        code, reason = supervise(roles, "learner")
    finally:
        stop_roles(roles)
    assert (code, reason) == (0, "")
    assert roles[0].restarts == 1


@pytest.mark.timeout(60)
def test_a_role_with_a_fatal_error_is_not_restarted_and_restart_max_is_not_suggested(tmp_path):
    marker = tmp_path / "starts"
    code = (
        "from asyncrl.core.runtime import fatal; import sys\n"
        f"open({str(marker)!r}, 'a').write('x')\n"
        f"with fatal.recorded({str(tmp_path)!r}, 'actor0'):\n"
        "    raise fatal.FatalError('task.reward_fn failed on 100% of recent rewards')\n"
    )
    roles = [
        role(tmp_path, "learner", "import time; time.sleep(30)"),
        role(tmp_path, "actor0", code, restart_max=3),
    ]
    try:
        exit_code, reason = supervise(roles, "learner")
    finally:
        stop_roles(roles)
    assert exit_code == 1
    assert marker.read_text() == "x"  # started once: a restart would fail the same way
    assert reason.startswith("actor0 exited with code 1: task.reward_fn failed on 100%"), reason
    assert "was not restarted" in reason and "restart_max" not in reason, reason


def test_torchruns_own_report_becomes_one_line_under_the_ranks_traceback():
    rank = [
        "[rank1]: Traceback (most recent call last):\n",
        '[rank1]:   File "learner/trainer.py", line 175, in run_learner\n',
        "[rank1]: asyncrl.core.runtime.faults.FailpointError: failpoint learner.after_step (hit 2)\n",
    ]
    agent = [
        "W1124 05:53:52.430000 23468 .venv/lib/python3.11/site-packages/torch/distributed/"
        "elastic/multiprocessing/api.py:1028] Sending process 23474 closing signal SIGTERM\n",
        "Traceback (most recent call last):\n",
        '  File "/x/.venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1028\n',
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n",
        "Root Cause (first observed failure):\n",
        "[0]:\n",
        "  rank      : 1 (local_rank: 1)\n",
        "  exitcode  : 1 (pid: 23475)\n",
        "============================================================\n",
    ]
    kept = launcher._without_torchrun_report(rank + agent)
    assert kept == rank + [
        "(torchrun: a learner rank failed; first failure: rank 1, exit code 1)\n"
    ]
    assert launcher._without_torchrun_report(rank) == rank  # nothing else is touched


def _child_failed(rank: int, exitcode: int):
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    failure = ProcessFailure(local_rank=rank, pid=4242, exitcode=exitcode, error_file="<N/A>")
    return ChildFailedError("asyncrl.learner.main", {rank: failure})


@pytest.mark.parametrize(("exitcode", "how"), [(1, "exit code 1"), (-9, "signal SIGKILL")])
def test_a_failed_rank_ends_torchrun_with_one_line_and_no_traceback(capsys, exitcode, how):
    """Formerly, torchrun's own traceback and report box reached the console on every learner
    failure; the rank's traceback above says what happened."""
    from asyncrl.core.runtime import torchrun

    def fails():
        raise _child_failed(1, exitcode)

    with pytest.raises(SystemExit) as e:
        torchrun.run(fails)
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err == f"[torchrun] learner rank 1 failed ({how}); its error is above\n"


@pytest.mark.timeout(60)
def test_what_a_dead_role_left_outside_its_process_group_is_killed(tmp_path):
    """A role (an actor whose reward started a server in a session of its own) dies; the
    launcher's ``kill_leftovers`` finds the server by the role's tag in its environment
    (asyncrl/core/runtime/lifeline.py ``ROLE_TREE_ENV``), not only by process group."""
    pid_file = tmp_path / "daemon.pid"
    code = (
        "import subprocess, sys\n"
        "p = subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "sys.exit(3)\n"
    )
    r = role(tmp_path, "actor0", code)
    assert r.proc.wait(30) == 3
    pid = int(pid_file.read_text())
    assert os.getpgid(pid) != r.proc.pid  # outside the role's group: killpg alone misses it
    launcher.kill_leftovers(r)
    deadline = time.monotonic() + 5
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _running(pid), "the process the role started outlived it"


def _running(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False
