"""``actor.engine_cpus``: the engine's processes on their own cores, apart from the actor's.

An actor is one client process (asyncio: vLLM's ``AsyncLLM`` client, leases, rewards, Arrow,
Redis) and the engine's processes it starts (vLLM's engine core and model worker). Sharing
cores, every millisecond the client works is one the engine does not generate; on one shared
core the demo actor reaches 0.65-0.74x of vLLM's offline batch, and 0.92x with the engine on
a core of its own and a queue in vLLM (benchmarks/README.md, micro_overheads, eighth round)::

    actor cores (sched_getaffinity)      0 1            engine_cpus=1
    while the engine starts              this thread -> {1}: the engine's processes inherit it
    afterwards                           every thread of the client -> {0}

A process inherits the affinity of the thread that starts it, by fork or spawn, so the
starting thread holds the engine's cores while the engine starts; then every thread of the
client process, those the engine's client started meanwhile too (ZeroMQ's I/O threads), gets
the cores left.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager


@contextmanager
def engine_on(cores: Sequence[int] | None) -> Iterator[set[int] | None]:
    """Processes started inside run on ``cores``; afterwards this process keeps its other
    cores. Yields those (the client's), or None when ``cores`` is empty (nothing changes).

    Raises ValueError, before anything starts, when ``cores`` are not all this process's or
    leave it none."""
    if not cores:
        yield None
        return
    allowed, engine = os.sched_getaffinity(0), set(cores)
    spec = ",".join(map(str, sorted(engine)))
    if not engine <= allowed:
        raise ValueError(
            f"actor.engine_cpus={spec}: cores {sorted(engine - allowed)} are not this actor's "
            f"(it may run on {sorted(allowed)}; see actor.cpu_affinity)"
        )
    client = allowed - engine
    if not client:
        raise ValueError(
            f"actor.engine_cpus={spec} takes every core of this actor ({sorted(allowed)}) and "
            "leaves none to its own process: give the actor more cores (actor.cpu_affinity) "
            "or the engine fewer, or set actor.engine_cpus='' to share them"
        )
    os.sched_setaffinity(0, engine)
    try:
        yield client
    finally:
        _pin_threads(client)


def _pin_threads(cores: set[int]) -> None:
    """Every thread of this process onto ``cores`` (a thread may end while we go)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except (ProcessLookupError, FileNotFoundError):
            continue
