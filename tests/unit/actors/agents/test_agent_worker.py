"""Agents in worker processes (asyncrl/actors/agents/agent_worker.py) through the environments'
own pool (``EnvPool(..., module=AGENT_WORKER)``): each way an agent ends maps to the pool's
exception as an environment's would (raised or bad return -> ``EnvError``, hung ->
``EnvTimeout``, died -> ``EnvCrashed``, a bad spec -> ``EnvWorkerError`` naming the fix);
many episodes at once on two workers; and the plain ``openai`` client in a worker reaching
the real ``AgentServer`` with the base_url and key it was given. Real processes throughout,
agents from tests/fakes/agents.py."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from asyncrl.actors.agents.agent_worker import AGENT_WORKER, no_proxy_loopback
from asyncrl.actors.episodes.env_pool import (
    EnvCounters,
    EnvCrashed,
    EnvError,
    EnvPool,
    EnvTimeout,
    EnvWorkerError,
)
from tests.fakes.agents import spec_of
from tests.fakes.pools import drive

pytestmark = pytest.mark.timeout(60)
URL, KEY = "http://127.0.0.1:9/v1", "sk-asyncrl-test"


def pool_of(name: str, workers: int = 1, timeout_s: float = 5.0, **kw) -> EnvPool:
    return EnvPool(spec_of(name), workers=workers, timeout_s=timeout_s, module=AGENT_WORKER, **kw)


async def run(pool: EnvPool, episode_id: str, row: dict | None = None) -> dict:
    """One agent episode as the runner drives it: begin, run, close; the checked result."""
    await pool.begin(episode_id)
    fields = {"row": row or {"prompt": "p"}, "base_url": URL, "api_key": KEY, "model": "policy"}
    reply = await pool.call(episode_id, "run", fields, "run")
    await pool.close(episode_id)
    return reply["result"]


def test_results_come_back_checked_from_every_kind_of_agent(tmp_path):
    closed = tmp_path / "closed"
    names = ("returns_float", "returns_dict", "returns_none", "sync_agent")
    pools = [pool_of(n) for n in names] + [pool_of("Counter", env_kwargs={"start": 4})]

    async def body():
        try:
            return [await run(p, f"e{i}", {"closed": str(closed)}) for i, p in enumerate(pools)]
        finally:
            for p in pools:
                await p.shutdown()

    floats, dicts, none, sync, counted = asyncio.run(body())
    assert floats == {"score": 0.75, "extras": {}}
    assert dicts == {"score": 1.0, "extras": {"calls": 2.0, "solved": 1.0}}
    assert none == {"score": None, "extras": {}}
    assert sync["score"] == 0.5 and sync["extras"]["in_thread"] == 1.0
    assert counted == {"score": 5.0, "extras": {}}
    assert closed.read_text() == "5"  # close() ran in the worker, after run
    assert all(p.counters == EnvCounters(calls=3) for p in pools)


def test_an_agent_that_raises_ends_its_episode_with_the_message_and_traceback():
    async def body(pool):
        with pytest.raises(EnvError) as e:
            await run(pool, "r", {"prompt": "2+2?"})
        with pytest.raises(ValueError, match="is not open"):  # the pool forgot the episode
            await pool.call("r", "run", {}, "run")
        await pool.close("r")  # a no-op
        return e.value

    pool = pool_of("raises")
    error = drive(pool, body)
    assert str(error) == "run: ValueError: the agent gave up on '2+2?'"
    assert "in raises\n    raise ValueError(" in error.traceback
    assert pool.counters.errors == 1


def test_a_bad_return_is_an_error_naming_the_kind_and_the_fix():
    async def body(pool):
        errors = []
        for i, value in enumerate(["1.0", {"value": 1}, 1e9]):
            with pytest.raises(EnvError) as e:
                await run(pool, f"b{i}", {"value": value})
            errors.append(str(e.value))
        return errors

    errors = drive(pool_of("bad_value"), body)
    prefix = f"run: AgentReturnError: {{}}: agent {spec_of('bad_value')} returned "
    kinds = ["wrong_type", "missing_score", "out_of_range"]
    assert [e.startswith(prefix.format(k)) for e, k in zip(errors, kinds, strict=True)] == [
        True
    ] * 3, errors
    assert all("return a float, a dict with a finite 'score'" in e for e in errors)


@pytest.mark.parametrize("name, where", [("hangs", "in hangs"), ("blocks", "time.sleep(3600)")])
def test_an_agent_that_hangs_times_out_saying_where_and_the_worker_goes_on(name, where):
    async def body(pool):
        t0 = time.monotonic()
        with pytest.raises(EnvTimeout) as e:
            await run(pool, "stuck")
        took = time.monotonic() - t0
        with pytest.raises(ValueError, match="is not open"):
            await pool.call("stuck", "run", {}, "run")
        return e.value, took, pool.pids

    pool = pool_of(name, timeout_s=0.5)
    error, took, pids = drive(pool, body)
    assert 0.5 <= took < 1.5, f"the timeout took {took:.2f} s"
    assert str(error).startswith(
        f"run of episode 'stuck' did not return within timeout_s=0.5 s (agent {spec_of(name)}); "
        "where it was: run of episode 'stuck'"
    )
    assert where in str(error), str(error)
    assert len(pids) == 1  # its loop answered: not killed
    assert (pool.counters.timeouts, pool.counters.crashes) == (1, 0)


def test_an_agent_that_kills_its_worker_fails_its_episodes_and_a_new_worker_follows():
    async def body(pool):
        await pool.begin("bystander")
        first = pool.pids[0]
        with pytest.raises(EnvCrashed) as crashed:
            await run(pool, "dies")
        with pytest.raises(EnvCrashed) as bystander:
            await pool.call("bystander", "run", {}, "run")
        await pool.begin("later")
        return first, crashed.value, bystander.value, pool.pids

    pool = pool_of("exits")
    first, crashed, bystander, later = drive(pool, body)
    assert str(crashed) == f"the agent worker process (pid {first}) died: exit code 3"
    assert str(bystander) == str(crashed)
    assert later != [first] and len(later) == 1
    assert (pool.counters.crashes, pool.counters.restarts) == (1, 1)


def test_many_episodes_run_at_once_on_two_workers():
    async def body(pool):
        await pool.start()
        t0 = time.monotonic()
        results = await asyncio.gather(*(run(pool, f"e{i}", {"sleep": 0.5}) for i in range(8)))
        return results, time.monotonic() - t0

    results, took = drive(pool_of("sleeps", workers=2), body)
    assert took < 1.5, f"8 episodes of 0.5 s took {took:.2f} s: not at once"
    pids = [r["extras"]["pid"] for r in results]
    assert sorted(pids.count(p) for p in set(pids)) == [4, 4]  # the least loaded worker each


@pytest.mark.parametrize(
    "name, kwargs, tools, expected",
    [
        ("nope", {}, [], "has no attribute 'nope'; define 'async def nope(row, *, base_url,"),
        ("raises", {"bonus": 1}, [], "raises (FILE:"),
        ("Counter", {"stop": 1}, [], "cannot take episode.agent_kwargs={'stop': 1}"),
        ("returns_float", {}, ["m:f"], "cannot go with an agent; an agent runs its own tools"),
    ],
)
def test_a_bad_spec_is_a_fatal_error_naming_the_fix(name, kwargs, tools, expected):
    async def body(pool):
        with pytest.raises(EnvWorkerError) as e:
            await pool.begin("e")
        return e.value

    pool = pool_of(name, env_kwargs=kwargs, tool_specs=tools)
    error = drive(pool, body)
    assert str(error).startswith("an agent worker process: ")
    assert expected.replace("FILE", spec_of(name).rpartition(":")[0]) in str(error), str(error)
    assert pool.pids == []


def test_loopback_joins_no_proxy_in_both_spellings():
    environ = {"NO_PROXY": "corp.example, 127.0.0.1", "HTTP_PROXY": "http://proxy:3128"}
    no_proxy_loopback(environ)
    assert environ["NO_PROXY"] == environ["no_proxy"] == "corp.example,127.0.0.1,localhost"
    empty: dict[str, str] = {}
    no_proxy_loopback(empty)
    assert empty == {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def test_an_agent_in_a_worker_calls_the_real_endpoint_with_its_url_and_key(tmp_path, monkeypatch):
    pytest.importorskip("openai", reason="openai comes with vLLM; install vllm to run")
    pytest.importorskip("aiohttp", reason="aiohttp comes with vLLM; install vllm to run")
    from asyncrl.actors.agents.policy import CallPolicy
    from asyncrl.actors.agents.record import AgentEpisode, CallLimits
    from asyncrl.actors.agents.server import AgentServer
    from asyncrl.actors.engine.completions import Completion
    from asyncrl.orchestration.demo.tokenizer import build_tokenizer
    from tests.fakes.engines import EngineCalls, ScriptedEngine

    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # unused: the worker sets NO_PROXY
    tok = build_tokenizer()
    ids = tok.encode("hello there", add_special_tokens=False)
    engine = ScriptedEngine([Completion(ids, [-0.5] * len(ids), [0] * len(ids), "stop")])
    out = tmp_path / "seen.json"
    row = {"messages": [{"role": "user", "content": "hi"}], "out": str(out)}
    row["expect"] = tok.decode(ids, skip_special_tokens=True)

    async def body(pool):
        server = AgentServer(EngineCalls(engine), tok)
        url = await server.start()
        ep = AgentEpisode("a1", row, 7, CallPolicy(16, 1.0), CallLimits(4, 200, 2000))
        key = server.open(ep)
        try:
            await pool.begin("a1")
            fields = {"row": row, "base_url": url, "api_key": key, "model": "policy"}
            reply = await pool.call("a1", "run", fields, "run")
            await pool.close("a1")
        finally:
            server.end("a1", "done")
            await server.close()
        return url, key, reply["result"], ep

    url, key, result, ep = drive(pool_of("chats", timeout_s=30.0), body)
    seen = json.loads(out.read_text())
    assert (seen["base_url"], seen["api_key"], seen["model"]) == (url, key, "policy")
    assert seen["models"] == ["policy"] and seen["content"] == row["expect"]
    assert "127.0.0.1" in seen["no_proxy"].split(",")
    assert result == {"score": 1.0, "extras": {}}
    assert [c.kind for c in ep.calls] == ["first"] and engine.calls[0].seed == 7
