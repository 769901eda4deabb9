"""How ``asyncrl eval`` stops on SIGINT/SIGTERM, in its two phases.

    engine start (blocking code)   a signal raises KeyboardInterrupt where it lands: vLLM's
                                   start unwinds and stops its processes. vLLM swallows one
                                   that lands in its startup poll (pyzmq's zmq_poll, where it
                                   waits for its engine process most of the start), so the
                                   stop is also remembered: a start that returns anyway is
                                   stopped then, and one still running HARD_STOP_S after the
                                   signal (or at a second signal) is ended: its processes
                                   SIGKILLed, exit 130 (``hard_stop``)
    scoring (the event loop)       a signal sets ``requested``; the loop reads it every
                                   scoring.POLL_S and keeps the prompts scored so far

Killing vLLM's engine process instead of waiting was tried: a start whose engine process
died after the handshake waits for it for ``VLLM_ENGINE_READY_TIMEOUT_S`` (600 s).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

HARD_STOP_S = 5.0
"""How long a stopped engine start may take to unwind before its processes are killed."""
EXIT_INTERRUPTED = 130
HARD_STOP_MESSAGE = (
    b"asyncrl: interrupted (Ctrl-C or SIGTERM) while the vLLM engine started; its processes "
    b"were killed\n"
)
REAP_S = 2.0
"""How long ``hard_stop`` waits for each process it killed to be gone."""


class StopSignals:
    """``starting()`` and ``scoring()`` route SIGINT/SIGTERM for their phase (module
    docstring); ``requested`` is set by the first signal of either."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self._timer: threading.Timer | None = None

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        try:
            with signals_to(self._during_start):
                yield
        finally:
            if self._timer is not None:
                self._timer.cancel()

    @contextlib.contextmanager
    def scoring(self) -> Iterator[None]:
        with signals_to(lambda signum, frame: self.requested.set()):
            yield

    def _during_start(self, signum: int, frame) -> None:
        if self.requested.is_set():  # a second signal: do not wait for the start
            hard_stop()
        self.requested.set()
        self._timer = threading.Timer(HARD_STOP_S, hard_stop)
        self._timer.daemon = True
        self._timer.start()
        raise KeyboardInterrupt


def hard_stop() -> None:
    """SIGKILL this process's descendants but multiprocessing's resource tracker (it removes
    the shared memory they leave once this process exits), then exit 130 without unwinding
    (the start cannot be unwound: that is why this runs)."""
    from asyncrl.orchestration.launch.launcher import process_tree, send_signal

    sys.stdout.flush()
    os.write(2, HARD_STOP_MESSAGE)
    killed = []
    for p in process_tree(os.getpid())[1:]:
        try:
            tracker = "resource_tracker" in " ".join(p.cmdline())
        except Exception:  # gone already (psutil.NoSuchProcess) or not ours to read
            continue
        if not tracker:
            send_signal(p, signal.SIGKILL)
            killed.append(p)
    for p in killed:  # reaps this process's own children
        with contextlib.suppress(Exception):  # gone, or not our child (psutil polls it)
            p.wait(REAP_S)
    os._exit(EXIT_INTERRUPTED)


@contextlib.contextmanager
def signals_to(handler: Callable) -> Iterator[None]:
    """SIGINT and SIGTERM go to ``handler`` inside the block; the handlers before it (the
    command's) are restored after it."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in before:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in before.items():
            signal.signal(sig, old)
