"""Environments in worker processes (asyncrl/actors/episodes/env_pool.py, env_worker.py):
episodes run sync and async environments, many at once without holding each other up; a step
that hangs, raises or kills its worker ends its episode with ``EnvTimeout``, ``EnvError`` or
``EnvCrashed`` (counted), and the pool goes on; a bad spec fails at start; nothing is left
running after ``shutdown``. Real worker processes throughout (environments from ``ENVS``,
written to a file per test)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from asyncrl.actors.episodes import env_pool
from asyncrl.actors.episodes.env import TOOLS_ONLY, StepResult
from asyncrl.actors.episodes.env_pool import (
    EnvCounters,
    EnvCrashed,
    EnvError,
    EnvPool,
    EnvTimeout,
    EnvWorkerError,
)
from asyncrl.actors.episodes.tool_calls import ToolCall
from asyncrl.core.runtime.fatal import FatalError
from tests.fakes.pools import drive

ENVS = '''
import asyncio, os, subprocess, sys, time
from pathlib import Path
from asyncrl.actors.episodes.env import StepResult

class Echo:
    """Ends at the second step, 0.5 a step. The step's content says what else to do."""

    def reset(self, row):
        print('{"id": 0, "messages": []}', flush=True)  # looks like a reply: must not be one
        self.row, self.turns = row, 0
        return row["prompt"]

    def step(self, message):
        print('{"id": 1, "result": {}}', flush=True)
        self.turns += 1
        what, *args = message["content"].split()
        if what == "sleep":
            time.sleep(float(args[0]))
        if what == "hang":
            time.sleep(60)
        if what == "raise":
            raise ValueError("no such move: raise")
        if what == "exit":
            os._exit(3)
        if what == "object":
            return [], None, False, {"x": object()}
        if what == "child":
            Path(args[0]).write_text(str(subprocess.Popen(["sleep", "60"]).pid))
            time.sleep(60)
        done = self.turns >= 2
        return [{"role": "user", "content": f"turn {self.turns}"}], 0.5, done, {"pid": os.getpid()}

    def close(self):
        if "closed" in self.row:
            Path(self.row["closed"]).write_text("closed")


class AsyncEcho:
    async def reset(self, row):
        await asyncio.sleep(0.01)
        return [{"role": "system", "content": "async"}, {"role": "user", "content": row["prompt"]}]

    async def step(self, message):
        what, *args = message["content"].split()
        if what == "sleep":
            await asyncio.sleep(float(args[0]))
        if what == "block":
            time.sleep(60)  # blocks the worker's event loop
        return StepResult([], 1.0, True, {"pid": os.getpid()})


class WithTools:
    def reset(self, row):
        self.notes = []
        return row["prompt"]

    def step(self, message):
        return StepResult([], None, True, {"notes": self.notes})

    def tools(self):
        return [self.note]

    def note(self, text: str) -> str:
        """Remember a note.

        Args:
            text: The note.
        """
        self.notes.append(text)
        return f"noted {len(self.notes)}"


class Levels:
    """Configured per run: episode.env_kwargs reach its constructor."""

    def __init__(self, level: int, names: list | None = None):
        self.level, self.names = level, names or []

    def reset(self, row):
        return f"level {self.level} {' '.join(self.names)}"

    def step(self, message):
        return [], float(self.level), True, {}


def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: The dividend.
        b: The divisor.
    """
    return a / b
'''


@pytest.fixture
def envs(tmp_path) -> Path:
    path = tmp_path / "envs.py"
    path.write_text(ENVS)
    return path


def _say(content: str) -> dict:
    return {"role": "assistant", "content": content}


def _running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not _running(pid)


def test_a_two_step_episode_whose_environment_prints(envs, tmp_path):
    closed = tmp_path / "closed"

    async def body(pool):
        opened = await pool.open("e1", {"prompt": "go", "closed": str(closed)})
        steps = [await pool.step("e1", _say("x")) for _ in range(2)]
        await pool.close("e1")
        return opened, steps

    pool = EnvPool(f"{envs}:Echo", workers=1, timeout_s=5.0)
    (messages, tools), (first, second) = drive(pool, body)
    assert messages == [{"role": "user", "content": "go"}] and tools == []
    pid = first.info["pid"]
    assert first == StepResult([{"role": "user", "content": "turn 1"}], 0.5, False, {"pid": pid})
    assert second.done and second.messages[0]["content"] == "turn 2"
    assert closed.read_text() == "closed"
    assert pool.counters == EnvCounters(calls=4)


def test_env_kwargs_reach_the_constructor_of_every_episode(envs):
    async def body(pool):
        opened = [await pool.open(e, {"prompt": "go"}) for e in ("a", "b")]
        return opened, await pool.step("b", _say("x"))

    pool = EnvPool(f"{envs}:Levels", timeout_s=5.0, env_kwargs={"level": 3, "names": ["x", "y"]})
    opened, step = drive(pool, body)
    assert [m for m, _ in opened] == [[{"role": "user", "content": "level 3 x y"}]] * 2
    assert step.reward == 3.0


def test_env_kwargs_the_constructor_does_not_take_are_refused_naming_them(envs):
    from asyncrl.actors.episodes.env import load_environment

    with pytest.raises(ValueError, match=r"Levels\(level: int, names.*cannot take "
                       r"episode.env_kwargs=\{'level': 1, 'levle': 3\}.*unexpected keyword"):  # fmt: skip
        load_environment(f"{envs}:Levels", {"level": 1, "levle": 3})
    with pytest.raises(ValueError, match="missing a required argument: 'level'"):
        load_environment(f"{envs}:Levels")
    with pytest.raises(EnvWorkerError, match="cannot take episode.env_kwargs"):
        drive(EnvPool(f"{envs}:Levels", timeout_s=5.0, env_kwargs={"levle": 3}), _started)


async def _started(pool):
    await pool.start()


def test_async_environment_methods(envs):
    async def body(pool):
        messages, _ = await pool.open("a", {"prompt": "go"})
        return messages, await pool.step("a", _say("sleep 0.01"))

    messages, step = drive(EnvPool(f"{envs}:AsyncEcho", timeout_s=5.0), body)
    assert messages == [
        {"role": "system", "content": "async"},
        {"role": "user", "content": "go"},
    ]
    assert (step.reward, step.done) == (1.0, True)


def test_many_episodes_on_two_workers_sleep_at_once(envs):
    """20 episodes, pinned 10 + 10; their 0.5 s steps (sync, in threads) overlap: ~0.5 s, not
    the >= 1 s of a default thread pool (cores + 4 = 6 threads a worker here)."""

    async def body(pool):
        await pool.start()
        names = [f"e{i}" for i in range(20)]
        await asyncio.gather(*(pool.open(n, {"prompt": "go"}) for n in names))
        t0 = time.monotonic()
        steps = await asyncio.gather(*(pool.step(n, _say("sleep 0.5")) for n in names))
        return steps, time.monotonic() - t0

    steps, took = drive(EnvPool(f"{envs}:Echo", workers=2, timeout_s=5.0), body)
    pids = [s.info["pid"] for s in steps]
    assert sorted(pids.count(p) for p in set(pids)) == [10, 10], "not spread over 2 workers"
    assert took < 0.9, f"20 steps of 0.5 s on 2 workers took {took:.2f} s: they did not overlap"


@pytest.mark.parametrize("env", ["Echo", "AsyncEcho"])
def test_a_slow_step_holds_up_no_other_episode_of_its_worker(envs, env):
    async def body(pool):
        await pool.open("slow", {"prompt": "go"})
        await pool.open("fast", {"prompt": "go"})
        slow = asyncio.ensure_future(pool.step("slow", _say("sleep 0.8")))
        await asyncio.sleep(0.1)  # the slow step is running
        t0 = time.monotonic()
        fast = await pool.step("fast", _say("x"))
        took = time.monotonic() - t0
        return (await slow).info["pid"], fast.info["pid"], took

    slow_pid, fast_pid, took = drive(EnvPool(f"{envs}:{env}", workers=1, timeout_s=5.0), body)
    assert slow_pid == fast_pid
    assert took < 0.4, f"a fast step waited {took:.2f} s behind a slow one"


@pytest.mark.parametrize(
    "env, hang, where",
    [
        ("Echo", "hang", "in step\n    time.sleep(60)"),  # the thread's stack
        ("AsyncEcho", "sleep 60", "in step\n    await asyncio.sleep(float(args[0]))"),
    ],
)
def test_a_step_that_hangs_times_out_and_the_worker_goes_on(envs, env, hang, where):
    async def body(pool):
        await pool.open("stuck", {"prompt": "go"})
        await pool.open("other", {"prompt": "go"})
        t0 = time.monotonic()
        with pytest.raises(EnvTimeout) as e:
            await pool.step("stuck", _say(hang))
        took = time.monotonic() - t0
        with pytest.raises(ValueError, match="is not open"):  # the pool forgot the episode
            await pool.step("stuck", _say("x"))
        await pool.close("stuck")  # a no-op
        return e.value, took, await pool.step("other", _say("x"))

    pool = EnvPool(f"{envs}:{env}", workers=1, timeout_s=0.5)
    error, took, other = drive(pool, body)
    assert 0.5 <= took < 1.0, f"the timeout took {took:.2f} s"
    assert str(error).startswith(
        "step of episode 'stuck' did not return within timeout_s=0.5 s (environment "
    )
    assert "where it was: step of episode 'stuck'" in str(error)
    assert where in str(error), str(error)
    assert other.reward is not None
    assert (pool.counters.timeouts, pool.counters.crashes) == (1, 0)


def test_a_step_that_raises_ends_its_episode_with_the_message(envs):
    async def body(pool):
        await pool.open("e", {"prompt": "go"})
        with pytest.raises(EnvError) as e:
            await pool.step("e", _say("raise"))
        await pool.close("e")  # a no-op: the pool forgot it
        with pytest.raises(EnvError, match="not JSON .*object"):
            await pool.open("j", {"prompt": "go"})
            await pool.step("j", _say("object"))
        with pytest.raises(TypeError, match="row must be JSON values"):
            await pool.open("r", {"prompt": "go", "x": object()})
        return e.value

    pool = EnvPool(f"{envs}:Echo", timeout_s=5.0)
    error = drive(pool, body)
    assert str(error) == "step: ValueError: no such move: raise"
    assert 'in step\n    raise ValueError("no such move: raise")' in error.traceback
    assert pool.counters.errors == 2


def test_a_worker_that_dies_fails_its_episodes_and_a_new_one_takes_the_next(envs):
    async def body(pool):
        await pool.open("dies", {"prompt": "go"})
        await pool.open("bystander", {"prompt": "go"})
        first = pool.pids[0]
        with pytest.raises(EnvCrashed) as crashed:
            await pool.step("dies", _say("exit"))
        with pytest.raises(EnvCrashed) as bystander:
            await pool.step("bystander", _say("x"))
        await pool.open("later", {"prompt": "go"})
        later = await pool.step("later", _say("x"))
        return first, crashed.value, bystander.value, later

    pool = EnvPool(f"{envs}:Echo", workers=1, timeout_s=5.0)
    first, crashed, bystander, later = drive(pool, body)
    assert str(crashed) == f"the environment worker process (pid {first}) died: exit code 3"
    assert str(bystander) == str(crashed)
    assert later.reward == 0.5 and later.info["pid"] != first
    assert (pool.counters.crashes, pool.counters.restarts) == (1, 1)


def test_a_worker_whose_loop_blocks_is_killed(envs, monkeypatch):
    monkeypatch.setattr(env_pool, "_PING_S", 0.5)

    async def body(pool):
        await pool.open("blocks", {"prompt": "go"})
        await pool.open("bystander", {"prompt": "go"})
        first = pool.pids[0]
        with pytest.raises(EnvTimeout) as timeout:
            await pool.step("blocks", _say("block"))
        with pytest.raises(EnvCrashed, match="was stuck: it did not answer within 0.5 s"):
            await pool.step("bystander", _say("x"))
        await pool.open("later", {"prompt": "go"})
        return first, timeout.value, (await pool.step("later", _say("x"))).info["pid"]

    pool = EnvPool(f"{envs}:AsyncEcho", workers=1, timeout_s=0.3)
    first, timeout, later = drive(pool, body)
    assert "its worker was stuck and was killed; its threads were:" in str(timeout)
    assert "in step" in str(timeout)  # faulthandler's dump: the loop blocked in step
    assert later != first and _gone(first)
    assert pool.counters == EnvCounters(calls=5, timeouts=1, crashes=1, restarts=1)


def test_a_worker_holding_stuck_calls_is_retired_and_replaced(envs):
    async def body(pool):
        names = [f"e{i}" for i in range(env_pool._RETIRE_STUCK)]
        for n in names:
            await pool.open(n, {"prompt": "go"})
        first = pool.pids[0]
        steps = [pool.step(n, _say("hang")) for n in names]
        results = await asyncio.gather(*steps, return_exceptions=True)
        await pool.open("later", {"prompt": "go"})
        return first, results, (await pool.step("later", _say("x"))).info["pid"]

    pool = EnvPool(f"{envs}:Echo", workers=1, timeout_s=0.3)
    first, results, later = drive(pool, body)
    assert all(isinstance(r, EnvTimeout) for r in results), results
    assert later != first and _gone(first), "the retired worker was not replaced and killed"
    assert (pool.counters.restarts, pool.counters.crashes) == (1, 0)


def test_tools_answer_and_their_errors_come_back_as_text(envs):
    async def body(pool):
        _, schemas = await pool.open("t", {"prompt": "go"})
        results = [
            await pool.tool("t", ToolCall("note", {"text": "hello"})),
            await pool.tool("t", ToolCall("divide", {"a": 1, "b": 4})),
            await pool.tool("t", ToolCall("divide", {"a": 1, "b": 0})),
            await pool.tool("t", ToolCall("nope", {})),
        ]
        return schemas, results, await pool.step("t", _say("done"))

    pool = EnvPool(f"{envs}:WithTools", [f"{envs}:divide"], timeout_s=5.0)
    schemas, results, step = drive(pool, body)
    assert [s["function"]["name"] for s in schemas] == ["note", "divide"]
    assert [(r.content, r.error) for r in results[:2]] == [("noted 1", None), ("0.25", None)]
    assert results[2].error == "raised"
    assert results[2].content == "Error: divide raised ZeroDivisionError: division by zero"
    assert results[3].error == "unknown_tool"
    assert step.info == {"notes": ["hello"]}  # the bound method kept the episode's state


def test_tools_only_in_a_worker(envs):
    async def body(pool):
        messages, _ = await pool.open("t", {"prompt": "2+2?"})
        return messages, await pool.step("t", _say("4"))

    messages, step = drive(EnvPool(TOOLS_ONLY, timeout_s=5.0), body)
    assert messages == [{"role": "user", "content": "2+2?"}]
    assert step == StepResult([], None, True, {})


@pytest.mark.parametrize(
    "spec, tools, expected",
    [
        ("{envs}:Nope", [], "has no attribute 'Nope'; define it there or fix the name"),
        ("no_such_module_xyz:Env", [], "cannot import module 'no_such_module_xyz'"),
        ("{envs}:Echo", ["{envs}:missing"], "tool spec '{envs}:missing': "),
    ],
)
def test_a_bad_spec_is_a_fatal_error_naming_the_spec_and_the_fix(envs, spec, tools, expected):
    spec = spec.format(envs=envs)
    tools = [t.format(envs=envs) for t in tools]

    async def body(pool):
        with pytest.raises(EnvWorkerError) as e:
            await pool.open("e", {"prompt": "go"})
        return e.value

    pool = EnvPool(spec, tools)
    error = drive(pool, body)
    assert isinstance(error, FatalError)
    assert str(error).startswith("an environment worker process: ")
    assert expected.format(envs=envs) in str(error)
    assert pool.pids == []


def test_an_actor_cancelled_mid_step_leaves_no_process_behind(envs, tmp_path):
    """The actor's shape: a task that steps episodes and shuts the pool down in ``finally``;
    cancelled while a step hangs (and the environment started a child), it leaves no
    worker and no child running."""
    child = tmp_path / "child.pid"
    pool = EnvPool(f"{envs}:Echo", workers=2, timeout_s=30.0)
    pids: list[int] = []

    async def actor():
        try:
            await pool.start()
            pids.extend(pool.pids)
            await pool.open("e", {"prompt": "go"})
            await pool.step("e", _say(f"child {child}"))
        finally:
            await pool.shutdown()

    async def main():
        task = asyncio.ensure_future(actor())
        while not child.exists():
            await asyncio.sleep(0.02)
        task.cancel()
        t0 = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - t0

    took = asyncio.run(main())
    assert len(pids) == 2 and took < 2.5
    assert all(_gone(p, within=0.5) for p in [*pids, int(child.read_text())])
    assert pool.pids == []
