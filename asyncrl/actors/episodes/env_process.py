"""One environment worker process, seen from the actor: ``python -m
asyncrl.actors.episodes.env_worker`` (or another module speaking its protocol, ``module=``:
``asyncrl.actors.agents.agent_worker``) under ``asyncrl.core.runtime.lifeline`` (it dies with
the actor, however the actor dies), in a session of its own (a kill takes what the environment
started with it), with the buffer's password removed from its environment.

A reader thread turns reply lines into the futures of the calls in flight (matched by ``id``;
other lines are ignored) and, at end of output, reaps the process and fails every call still
in flight with ``WorkerDied``; a writer thread sends the requests, so a worker that stops
reading never blocks the actor's event loop. ``EnvPool`` (env_pool.py) decides what a failure
means; this module only moves lines and processes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time

from asyncrl.core.runtime.lifeline import child_cmd, kill_tree, tagged_env, worker_stacks

_SECRET_ENV = ("ASYNCRL_REDIS_URL",)  # the buffer's password: an environment needs none
ENV_WORKER = "asyncrl.actors.episodes.env_worker"
"""The environment worker's module; any worker module takes its argv (``SPEC TOOL_SPECS_JSON
STACK_FILE KWARGS_JSON``) and speaks its JSON-line protocol."""


def worker_noun(module: str) -> str:
    """What a worker module hosts, for messages: ``environment`` for ``ENV_WORKER``, else the
    module's last name without ``_worker`` (``agent_worker`` -> ``agent``)."""
    if module == ENV_WORKER:
        return "environment"
    return module.rpartition(".")[2].removesuffix("_worker")


class WorkerDied(Exception):
    """The worker process ended (its message says how) while a call or the start waited."""


def settle(future: concurrent.futures.Future, result=None, error: BaseException | None = None):
    with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled by a timeout
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


class EnvProcess:
    """One worker process (``python -m module``), its reader and writer threads and its
    calls in flight."""

    def __init__(
        self,
        spec: str,
        tool_specs: list[str],
        env_kwargs: dict | None = None,
        module: str = ENV_WORKER,
    ) -> None:
        fd, self.stack_path = tempfile.mkstemp(prefix="asyncrl-env-stack-")
        os.close(fd)
        self.noun = worker_noun(module)
        args = [spec, json.dumps(tool_specs), self.stack_path, json.dumps(env_kwargs or {})]
        cmd = [sys.executable, "-m", module, *args]
        env, self.tag = tagged_env({k: v for k, v in os.environ.items() if k not in _SECRET_ENV})
        self.proc = subprocess.Popen(
            child_cmd(cmd),
            env=env,
            start_new_session=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.ready: concurrent.futures.Future = concurrent.futures.Future()
        self.episodes: set[str] = set()
        self.retired = False
        self.gone = False  # killed by the pool (crashed, stuck, retired, failed to start)
        self.dead: str | None = None
        self._pending: dict[int, concurrent.futures.Future] = {}
        self._lock = threading.Lock()
        self._out: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._read, name="env-reader", daemon=True),
            threading.Thread(target=self._write, name="env-writer", daemon=True),
        ]
        for t in self._threads:
            t.start()

    @property
    def alive(self) -> bool:
        return self.dead is None and not self.gone and self.proc.poll() is None

    def send(self, call_id: int, line: bytes) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self.dead is not None:
                future.set_exception(WorkerDied(self.dead))
                return future
            self._pending[call_id] = future
        self._out.put(line)
        return future

    def forget(self, call_id: int) -> None:
        with self._lock:
            self._pending.pop(call_id, None)

    async def stacks(self) -> str:
        """Every thread's stack in the process now (``faulthandler`` on ``SIGUSR1``)."""
        with contextlib.suppress(OSError):
            os.truncate(self.stack_path, 0)  # the worker appends: this dump only
        return await worker_stacks(self.proc.pid, self.stack_path)

    def kill(self) -> None:
        """SIGKILL the process and everything it started; the reader reaps it."""
        self.gone = True
        kill_tree(self.proc, self.tag)
        self._out.put(None)
        with contextlib.suppress(OSError):
            os.unlink(self.stack_path)

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _write(self) -> None:
        assert self.proc.stdin is not None
        while (line := self._out.get()) is not None:
            try:
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
            except (OSError, ValueError):  # the process is gone: the reader tells the calls
                break
        with contextlib.suppress(OSError):
            self.proc.stdin.close()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue  # not ours (prints go to stderr): never a reply
            if not isinstance(msg, dict):
                continue
            if not self.ready.done():
                settle(self.ready, msg)
                continue
            with self._lock:
                future = self._pending.pop(msg.get("id"), None)  # type: ignore[arg-type]
            if future is not None:
                settle(future, msg)
        code = self.proc.wait()
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        with self._lock:
            self.dead = f"the {self.noun} worker process (pid {self.proc.pid}) died: {how}"
            pending, self._pending = list(self._pending.values()), {}
        error = WorkerDied(self.dead)
        settle(self.ready, error=error)
        for future in pending:
            settle(future, error=error)
