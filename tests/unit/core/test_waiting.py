"""asyncrl.core.runtime.waiting.Wait: progress lines, deadline and stop, on a settable clock."""

import pytest

from asyncrl.core.runtime.waiting import StopRequested, Wait


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _wait(clock, lines, stop=lambda: False, **kw) -> Wait:
    return Wait("2 actor(s) to register", 60.0, lines.append, stop, hint="start them",
                every_s=15.0, clock=clock, **kw)  # fmt: skip


def test_begin_names_what_and_the_deadline():
    lines: list[str] = []
    _wait(Clock(), lines).begin("0/2 registered")
    assert lines == ["waiting for 2 actor(s) to register (0/2 registered); giving up after 60s"]


def test_reports_every_interval_with_elapsed_and_deadline():
    clock, lines = Clock(), []
    w = _wait(clock, lines)
    for t in (0.0, 5.0, 14.9):
        clock.t = 100.0 + t
        w.check("1/2")
    assert lines == []  # quiet within the interval
    clock.t = 115.0
    w.check("1/2")
    clock.t = 129.9
    w.check("1/2")
    clock.t = 130.0
    w.check("1/2")
    assert lines == [
        "still waiting for 2 actor(s) to register (1/2): 15s of 60s",
        "still waiting for 2 actor(s) to register (1/2): 30s of 60s",
    ]


def test_past_the_deadline_raises_with_state_and_hint():
    clock, lines = Clock(), []
    w = _wait(clock, lines)
    clock.t = 160.0
    w.check()  # exactly at the deadline: not yet
    clock.t = 160.1
    with pytest.raises(TimeoutError) as e:
        w.check("1/2 registered")
    assert str(e.value) == (
        "gave up waiting for 2 actor(s) to register (1/2 registered) after 60s; start them"
    )


def test_timeout_error_class_is_configurable():
    class DataTimeout(TimeoutError):
        pass

    clock, lines = Clock(), []
    w = _wait(clock, lines, timeout_error=DataTimeout)
    clock.t = 200.0
    with pytest.raises(DataTimeout):
        w.check()


def test_a_stop_request_wins_over_everything_else():
    clock, lines, stop = Clock(), [], [False]
    w = _wait(clock, lines, stop=lambda: stop[0])
    w.check()
    stop[0] = True
    clock.t = 1000.0  # past the deadline too: the stop is reported, not a timeout
    with pytest.raises(StopRequested) as e:
        w.check()
    assert e.value.what == "2 actor(s) to register"
    assert str(e.value) == "stopped on request while waiting for 2 actor(s) to register"
    assert lines == []


@pytest.mark.parametrize("kw", [{"timeout_s": 0}, {"every_s": 0}])
def test_rejects_non_positive_durations(kw):
    args = {"what": "x", "timeout_s": 1.0, "say": print, **kw}
    with pytest.raises(ValueError):
        Wait(**args)
