"""Failpoints for fault-injection tests (test-only; inert unless ``ASYNCRL_FAILPOINTS`` is set).

Code marks a point where a crash matters with ``failpoint("checkpoint.before_marker")``; a
test arms it through the environment of the process it starts::

    ASYNCRL_FAILPOINTS="checkpoint.before_marker=kill@2,learner.after_save=exit"

Each entry is ``name=action[@n]``: fire on the ``n``-th hit of ``name`` in this process
(default 1; ``@0`` = every hit). A name may have several entries (e.g. a trace on every hit
and a kill on the third); they fire in the order given. Actions:

    kill      SIGKILL this process (a real signal: no cleanup, no atexit, no flush)
    exit      ``os._exit(77)`` (no cleanup either; a distinguishable exit status)
    raise     raise ``FailpointError`` (an ordinary crash with a traceback)
    sleep:S   sleep S seconds (to widen a race window a test wants to hit)
    trace:P   append ``{"name", "hit", "pid", **ctx}`` as one JSON line to file P (a test
              records what the process did at that point, e.g. which groups a step took)
    on        nothing, but ``failpoint`` returns True: the code there injects its own fault
              (``learner.nan_loss``: the policy update's advantages become NaN, so its loss
              and gradients are NaN; one hit per policy update in each learner rank)

The environment is read once per process. Nothing here runs in production: an unset or
empty ``ASYNCRL_FAILPOINTS`` makes ``failpoint`` a dictionary miss.
"""

from __future__ import annotations

import os
import signal
import time

ENV = "ASYNCRL_FAILPOINTS"
EXIT_STATUS = 77
_ACTIONS = ("kill", "exit", "raise", "sleep", "trace", "on")


class FailpointError(RuntimeError):
    """Raised by a failpoint armed with the ``raise`` action."""


_spec: dict[str, list[tuple[str, int]]] | None = None
_hits: dict[str, int] = {}


def parse(spec: str) -> dict[str, list[tuple[str, int]]]:
    """``"a=kill@2,b=sleep:0.5"`` -> ``{"a": [("kill", 2)], "b": [("sleep:0.5", 1)]}``."""
    out: dict[str, list[tuple[str, int]]] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, sep, rest = item.partition("=")
        action, _, nth = rest.partition("@")
        if not sep or not name or action.split(":")[0] not in _ACTIONS:
            raise ValueError(
                f"bad {ENV} entry {item!r}: expected name=action[@n] with action in {_ACTIONS}"
            )
        out.setdefault(name, []).append((action, int(nth) if nth else 1))
    return out


def _armed() -> dict[str, list[tuple[str, int]]]:
    global _spec
    if _spec is None:
        _spec = parse(os.environ.get(ENV, ""))
    return _spec


def failpoint(name: str, **ctx) -> bool:
    """Fire the action armed for ``name`` (see module docstring); ``ctx`` is for messages.
    True if an ``on`` entry fired (the caller injects its fault), else False."""
    armed = _armed()
    if name not in armed:
        return False
    _hits[name] = _hits.get(name, 0) + 1
    on = False
    for action, nth in armed[name]:
        if not nth or _hits[name] == nth:
            on |= action == "on"
            _fire(action, name, ctx)
    return on


def _fire(action: str, name: str, ctx: dict) -> None:
    """Do ``action`` (see module docstring) for failpoint ``name``."""
    where = f"failpoint {name} (hit {_hits[name]}{', ' if ctx else ''}"
    where += ", ".join(f"{k}={v}" for k, v in ctx.items()) + ")"
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "exit":
        os._exit(EXIT_STATUS)
    elif action == "raise":
        raise FailpointError(where)
    elif action == "on":
        return
    elif action.startswith("trace:"):
        _trace(action.split(":", 1)[1], {"name": name, "hit": _hits[name], "pid": os.getpid()}, ctx)
    else:
        time.sleep(float(action.split(":", 1)[1]))


def _trace(path: str, head: dict, ctx: dict) -> None:
    """Append one JSON line (flushed and fsynced: the process may be killed right after)."""
    import json

    with open(path, "a") as f:
        f.write(json.dumps({**head, **ctx}, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def reset() -> None:
    """Forget the parsed spec and hit counts (unit tests that change the env)."""
    global _spec
    _spec = None
    _hits.clear()
