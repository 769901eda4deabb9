"""tests/roles.py, the watcher every process-starting test uses: its rules on real (tiny)
processes. A death fails a wait at once with the log tail; expected exits do not."""

import signal
import time

import pytest

from tests.roles import RoleDied, Roles


def _py(roles: Roles, name: str, code: str, **kw):
    return roles.python(name, "-c", code, **kw)


def test_a_death_fails_the_wait_at_once_naming_it_with_its_log(tmp_path):
    with Roles(tmp_path) as roles:
        _py(roles, "sleeper", "import time; time.sleep(60)")
        _py(roles, "dier", "import sys; print('boom: the reason'); sys.exit(3)")
        t0 = time.monotonic()
        with pytest.raises(RoleDied) as e:
            roles.wait_until(lambda: False, 60, "something that never happens")
        assert time.monotonic() - t0 < 10
    msg = str(e.value)
    assert "'dier'" in msg and "exited with code 3" in msg and "boom: the reason" in msg, msg


def test_expected_exits_do_not_fail_a_wait(tmp_path):
    with Roles(tmp_path) as roles:
        _py(roles, "done", "print('ok')", may_exit=True)
        later = _py(roles, "later", "import time; time.sleep(0.5)")
        roles.expect_exit(later)
        marker = tmp_path / "m"
        _py(roles, "writer", f"import time, pathlib; time.sleep(1.5); pathlib.Path({str(marker)!r}).touch()", may_exit=True)  # fmt: skip
        roles.wait_until(marker.exists, 30, "the marker")
        # a non-zero exit of a process whose 0 exit was expected still fails
        bad = _py(roles, "bad", "import sys; sys.exit(1)")
        roles.expect_exit(bad)
        with pytest.raises(RoleDied):
            roles.wait_until(lambda: False, 30, "nothing")


def test_wait_returns_the_exit_code_and_fails_with_the_tail_on_timeout(tmp_path):
    with Roles(tmp_path) as roles:
        p = _py(roles, "three", "import sys; sys.exit(3)")
        assert roles.wait(p, 30) == 3  # the awaited process's own exit is not a death
        slow = _py(roles, "slow", "print('still here', flush=True); import time; time.sleep(60)")
        with pytest.raises(AssertionError) as e:
            roles.wait(slow, 1.5)
        assert not isinstance(e.value, RoleDied) and "still here" in str(e.value)


def test_teardown_kills_what_ignores_ctrl_c(tmp_path):
    roles = Roles(tmp_path, grace_s=1.0)
    stubborn = _py(roles, "stubborn", "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(60)")  # fmt: skip
    roles.wait_line(stubborn, "up", 30)
    t0 = time.monotonic()
    roles.stop_all()
    assert stubborn.poll() == -signal.SIGKILL and time.monotonic() - t0 < 15


def test_a_timed_out_wait_shows_where_each_role_waited_and_spares_the_others(tmp_path):
    """Before a timed-out wait fails, every process that catches the stack signal (the roles:
    ``enable_stack_dumps``) writes its threads' stacks to its log, and goes on; a process that
    does not catch it is not sent it (its default action would end it)."""
    role = (
        "from asyncrl.core.runtime.lifeline import enable_stack_dumps\nimport time\n"
        "def waits_for_the_buffer():\n    time.sleep(60)\n"
        "enable_stack_dumps()\nprint('up', flush=True)\nwaits_for_the_buffer()"
    )
    with Roles(tmp_path) as roles:
        stuck = _py(roles, "stuck", role)
        plain = _py(roles, "plain", "print('up', flush=True); import time; time.sleep(60)")
        roles.wait_line(stuck, "up", 30)
        roles.wait_line(plain, "up", 30)
        with pytest.raises(AssertionError) as e:
            roles.wait_until(lambda: False, 0.5, "a step that never comes")
        assert "(1 process(es) wrote their threads' stacks" in str(e.value)
        assert "in waits_for_the_buffer" in str(e.value)  # the tail shows the stack
        assert stuck.poll() is None and plain.poll() is None  # both still run
