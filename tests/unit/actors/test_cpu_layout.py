"""actors/engine/cpu_layout.py ``engine_on`` (``actor.engine_cpus``): processes started inside run on
the engine's cores, and afterwards every thread of the starting process, those started
meanwhile too, runs on the cores left; bad core lists fail before anything starts. The layout
runs in a child interpreter so that this test process keeps its own cores. The real engine's
processes are checked in tests/integration/test_engine_cpus.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from asyncrl.actors.engine.cpu_layout import engine_on

ALLOWED = sorted(os.sched_getaffinity(0))


def test_no_cores_changes_nothing():
    with engine_on(None) as client:
        assert client is None and sorted(os.sched_getaffinity(0)) == ALLOWED
    with engine_on([]) as client:
        assert client is None
    assert sorted(os.sched_getaffinity(0)) == ALLOWED


def test_cores_that_are_not_the_actors_are_refused_by_name():
    stranger = max(ALLOWED) + 1000
    want = rf"cores \[{stranger}\] are not this actor's"
    with pytest.raises(ValueError, match=want), engine_on([stranger]):
        pytest.fail("entered")
    assert sorted(os.sched_getaffinity(0)) == ALLOWED


def test_every_core_to_the_engine_is_refused_with_the_fix():
    want = "leaves none to its own process.*actor.cpu_affinity"
    with pytest.raises(ValueError, match=want), engine_on(ALLOWED):
        pytest.fail("entered")
    assert sorted(os.sched_getaffinity(0)) == ALLOWED


_LAYOUT = textwrap.dedent(
    """
    import json, os, subprocess, sys, threading
    from asyncrl.actors.engine.cpu_layout import engine_on

    engine = [max(os.sched_getaffinity(0))]
    stop = threading.Event()
    early = threading.Thread(target=stop.wait); early.start()  # a thread from before
    with engine_on(engine) as client:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        meanwhile = threading.Thread(target=stop.wait); meanwhile.start()
    threads = {int(t): sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}
    out = {"client": sorted(client), "child": sorted(os.sched_getaffinity(child.pid)),
           "threads": sorted(set(map(tuple, threads.values()))), "n_threads": len(threads)}
    child.kill(); child.wait(); stop.set(); early.join(); meanwhile.join()
    print(json.dumps(out))
    """
)


@pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two usable cores: one engine, one client")
def test_started_processes_get_the_engine_cores_and_every_thread_the_rest():
    from tests.e2e.conftest import REPO

    proc = subprocess.run([sys.executable, "-c", _LAYOUT], cwd=REPO, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    engine = [max(ALLOWED)]
    assert out["child"] == engine
    assert out["client"] == [c for c in ALLOWED if c not in engine]
    assert out["threads"] == [out["client"]] and out["n_threads"] >= 3, out
