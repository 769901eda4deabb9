"""A launcher's stop signals (orchestration/launch/stop_signals.py ``on_stop_signal``): the first
stops the job; a second hurries it, except a SIGTERM right after the first, which is the same
request (Slurm signals every process of a step and srun forwards its own SIGTERM too)."""

from __future__ import annotations

import signal
import threading

import pytest

from asyncrl.orchestration.launch import stop_signals


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    monkeypatch.setattr(stop_signals, "_stopping", threading.Event())
    monkeypatch.setattr(stop_signals, "_hurry", threading.Event())
    monkeypatch.setattr(stop_signals, "_first_signal_at", [])


def _clock(monkeypatch, t: list[float]) -> None:
    monkeypatch.setattr(stop_signals.time, "monotonic", lambda: t[0])


@pytest.mark.parametrize("first", [signal.SIGTERM, signal.SIGINT])
def test_a_sigterm_right_after_the_first_signal_does_not_hurry(monkeypatch, first):
    t = [100.0]
    _clock(monkeypatch, t)
    with pytest.raises(KeyboardInterrupt):
        stop_signals.on_stop_signal(first, None)
    t[0] += stop_signals.REPEATED_SIGTERM_S - 0.1
    stop_signals.on_stop_signal(signal.SIGTERM, None)
    assert not stop_signals.hurried()


def test_a_later_sigterm_or_a_second_ctrl_c_hurries(monkeypatch, capfd):
    t = [100.0]
    _clock(monkeypatch, t)
    with pytest.raises(KeyboardInterrupt):
        stop_signals.on_stop_signal(signal.SIGINT, None)
    stop_signals.on_stop_signal(signal.SIGINT, None)  # at once: a person pressing Ctrl-C again
    assert stop_signals.hurried()
    assert "already stopping" in capfd.readouterr().err

    monkeypatch.setattr(stop_signals, "_hurry", threading.Event())
    t[0] += stop_signals.REPEATED_SIGTERM_S + 0.1
    stop_signals.on_stop_signal(signal.SIGTERM, None)
    assert stop_signals.hurried()


def test_a_sigterm_during_a_shutdown_no_signal_began_hurries(monkeypatch):
    stop_signals.begin_shutdown()  # the run ended by itself
    stop_signals.on_stop_signal(signal.SIGTERM, None)
    assert stop_signals.hurried()
