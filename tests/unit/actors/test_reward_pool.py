"""The reward worker pool (actors/rewards/pool.py) through ``RewardScorer``: a group's calls run
at once and come back in sample order, for both executors; a process worker past its
deadline is killed (with what it started) and replaced, one that dies mid-call is replaced
and the call counts as ``crashed``; error kinds and the first error's traceback come back
from a process; nothing is left running after ``close``. Real worker processes throughout
(spec ``tests/unit/actors/pool_rewards.py:behave``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from asyncrl.actors.rewards.loading import load_reward_fn
from asyncrl.actors.rewards.pool import ProcessWorker, RewardWorkerError
from asyncrl.actors.rewards.sandbox import SandboxError
from asyncrl.actors.rewards.scoring import RewardScorer
from asyncrl.core.config.job import TaskConfig

SPEC = f"{Path(__file__).with_name('pool_rewards.py')}:behave"


def _scorer(executor="process", workers=4, timeout=10.0, lines=None, kinds=None, spec=SPEC,
            memory_mb=0):  # fmt: skip
    task = TaskConfig(
        reward_fn=spec, reward_executor=executor, reward_workers=workers,
        reward_timeout_s=timeout, reward_memory_mb=memory_mb,
    )  # fmt: skip
    fn = load_reward_fn(SPEC)  # thread workers call it; process workers load the spec
    say = (lines if lines is not None else []).append
    return RewardScorer(fn, task, say, (kinds if kinds is not None else []).append)


def _pids(scorer) -> list[int]:
    return [w.pid for w in scorer.pool.workers if isinstance(w, ProcessWorker)]


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


@pytest.mark.parametrize("executor", ["process", "thread"])
def test_a_groups_calls_run_at_once_and_come_back_in_sample_order(executor):
    """8 calls of 50 ms on 4 workers: ~0.1 s, not the 0.4 s of one after another."""
    calls = [f"sleep {0.05 + 0.01 * (i % 3)} {i}" for i in range(8)]  # finish out of order

    async def main():
        scorer = _scorer(executor, workers=4)
        try:
            await scorer.score_all("p", ["sleep 0 0"] * 4, {})  # start the 4 workers
            t0 = time.monotonic()
            results = await scorer.score_all("p", calls, {})
            return results, time.monotonic() - t0
        finally:
            scorer.close()

    results, took = asyncio.run(main())
    assert [r.value for r in results] == [float(i) for i in range(8)]
    assert not any(r.kind for r in results)
    assert took < 0.3, f"8 x 50 ms on 4 workers took {took:.3f} s: the calls did not overlap"


def test_a_timed_out_call_kills_its_process_and_what_it_started_and_a_fresh_one_goes_on(
    tmp_path,
):
    lines: list[str] = []
    kinds: list[str] = []
    pid_file = tmp_path / "child.pid"

    async def main():
        scorer = _scorer(workers=1, timeout=1.0, lines=lines, kinds=kinds)
        try:
            first_pid = (await scorer.score("p", "pid", {})).value
            t0 = time.monotonic()
            stuck = await scorer.score("p", "child", {"pid_file": str(pid_file)})
            took = time.monotonic() - t0
            after = (await scorer.score("p", "pid", {})).value
            return int(first_pid), stuck, took, int(after)
        finally:
            scorer.close()

    first_pid, stuck, took, after = asyncio.run(main())
    assert stuck.kind == "timeout" and stuck.value == 0.0
    assert stuck.reason == "timeout: the call took longer than task.reward_timeout_s=1 s"
    assert 1.0 <= took < 3.0
    assert after != first_pid, "the timed-out worker was given the next call"
    assert _gone(first_pid), "the timed-out worker process is still running"
    assert _gone(int(pid_file.read_text())), "the process the reward started is still running"
    assert kinds == ["timeout"]
    # the log shows where the call was stuck (faulthandler's dump from the worker)
    assert any("line" in x and "in behave" in x for x in lines), lines
    assert any("in score_call" in x for x in lines), lines


def test_error_kinds_and_the_first_errors_traceback_come_back_from_a_process():
    lines: list[str] = []
    kinds: list[str] = []

    async def main():
        scorer = _scorer(workers=2, lines=lines, kinds=kinds)
        try:
            return await scorer.score_all("12+3=", ["raise", "str", "nan", "raise", "print"], {})
        finally:
            scorer.close()

    results = asyncio.run(main())
    assert [r.kind for r in results] == ["raised", "wrong_type", "non_finite", "raised", ""]
    assert results[0].reason == "raised: reward function raised ValueError: bad 12+3="
    assert results[4].value == 1.0, "a print that looks like a reply was taken for one"
    assert sorted(kinds) == ["non_finite", "raised", "raised", "wrong_type"]
    headers = [x for x in lines if x.startswith("reward error")]
    assert len(headers) == 3, "the first error of each kind is logged, once"
    assert "| Traceback (most recent call last):" in lines
    assert any("pool_rewards.py" in x and "in behave" in x for x in lines), lines
    assert "| ValueError: bad 12+3=" in lines
    assert any("returned '1.0'" in x for x in lines) and any("returned nan" in x for x in lines)


def test_a_reward_raising_keyboard_interrupt_or_system_exit_is_a_raised_error_not_a_crash():
    """Issue 43 round 4: a reward raising KeyboardInterrupt killed each worker, with 131 bare
    tracebacks on the console. Now the same worker scores it 0 as ``raised`` and goes on."""
    lines: list[str] = []

    async def main():
        scorer = _scorer(workers=1, lines=lines)
        try:
            before = (await scorer.score("p", "pid", {})).value
            failed = await scorer.score_all("p", ["interrupt", "exit0"], {})
            after = (await scorer.score("p", "pid", {})).value
            return before, failed, after
        finally:
            scorer.close()

    before, failed, after = asyncio.run(main())
    assert [r.kind for r in failed] == ["raised", "raised"]
    assert failed[0].reason == "raised: reward function raised KeyboardInterrupt"
    assert failed[1].reason == "raised: reward function raised SystemExit: 0"
    assert before == after, "the worker died"
    assert "| KeyboardInterrupt" in lines


def test_a_reward_past_its_memory_limit_fails_naming_the_key_and_the_worker_lives_on():
    """Issue 43 round 4: nothing capped a reward worker's memory (only a cgroup set by hand
    made the kernel pick the workers instead of the actor)."""

    async def main():
        scorer = _scorer(workers=1, memory_mb=300)
        try:
            before = (await scorer.score("p", "pid", {})).value
            small = await scorer.score("p", "hog", {"mb": 50})
            big = await scorer.score("p", "hog", {"mb": 600})
            after = (await scorer.score("p", "pid", {})).value
            return before, small, big, after
        finally:
            scorer.close()

    before, small, big, after = asyncio.run(main())
    assert small.value == 1.0 and not small.kind
    assert big.kind == "raised" and big.value == 0.0
    assert big.reason.startswith("raised: reward function raised MemoryError")
    assert (
        "the worker's memory limit is task.reward_memory_mb=300 MiB: raise it, or -1 for none"
        in big.reason
    )
    assert before == after, "the worker died"


def test_a_worker_that_dies_mid_call_is_replaced_and_the_call_is_a_crashed_error():
    lines: list[str] = []
    kinds: list[str] = []

    async def main():
        scorer = _scorer(workers=1, lines=lines, kinds=kinds)
        try:
            before = int((await scorer.score("p", "pid", {})).value)
            crashed = await scorer.score("p", "exit", {})
            after = int((await scorer.score("p", "pid", {})).value)
            return before, crashed, after
        finally:
            scorer.close()

    before, crashed, after = asyncio.run(main())
    assert crashed.kind == "crashed" and crashed.value == 0.0
    assert crashed.reason == (
        f"crashed: the reward worker process (pid {before}) died: exit code 3"
    )
    assert after != before and kinds == ["crashed"]
    assert any(x.startswith("reward error (crashed)") for x in lines), lines


def test_close_leaves_no_process_behind_even_with_a_call_stuck_in_one(tmp_path):
    pid_file = tmp_path / "child.pid"

    async def main():
        scorer = _scorer(workers=3, timeout=60.0)
        await scorer.score_all("p", ["pid"] * 3, {})
        stuck = asyncio.create_task(scorer.score("p", "child", {"pid_file": str(pid_file)}))
        while not pid_file.exists():
            await asyncio.sleep(0.02)
        pids = _pids(scorer)
        stuck.cancel()  # what a stop does to the groups in flight
        with pytest.raises(asyncio.CancelledError):
            await stuck
        scorer.close()
        return pids

    t0 = time.monotonic()
    pids = asyncio.run(main())
    assert len(pids) == 3
    for pid in [*pids, int(pid_file.read_text())]:
        assert _gone(pid), f"process {pid} outlived close()"
    assert time.monotonic() - t0 < 10


def test_what_a_reward_started_in_a_session_of_its_own_is_killed_too(tmp_path):
    """Issue 43 round 4: a reward's ``Popen(..., start_new_session=True)`` left one process
    per worker running after the job (only the worker's process group was killed). Now the
    worker's tag in their environment finds them: after ``close``, and after the worker died
    on its own (the child re-parented away from it)."""
    left, orphaned = tmp_path / "left.pid", tmp_path / "orphaned.pid"

    async def main():
        scorer = _scorer(workers=1)
        try:
            done = await scorer.score("p", "daemon", {"pid_file": str(left)})
            crashed = await scorer.score("p", "daemon_exit", {"pid_file": str(orphaned)})
            return done, crashed
        finally:
            scorer.close()

    done, crashed = asyncio.run(main())
    assert done.value == 1.0 and crashed.kind == "crashed"
    for pid_file in (left, orphaned):
        pid = int(pid_file.read_text())
        assert _gone(pid), f"process {pid} started by the reward ({pid_file.name}) outlived it"


def test_a_machine_that_cannot_sandbox_fails_the_actor_from_a_process_too():
    async def main():
        scorer = _scorer(workers=1)
        try:
            await scorer.score("p", "sandbox", {})
        finally:
            scorer.close()

    with pytest.raises(SandboxError, match="no landlock"):
        asyncio.run(main())


def test_a_worker_gets_no_buffer_password_and_a_spec_it_cannot_load_is_fatal(monkeypatch):
    monkeypatch.setenv("ASYNCRL_REDIS_URL", "redis://:secret@127.0.0.1:1/0")

    async def main(spec):
        scorer = _scorer(workers=1, spec=spec)
        try:
            return await scorer.score("p", "secret", {})
        finally:
            scorer.close()

    assert asyncio.run(main(SPEC)).value == 0.0
    with pytest.raises(RewardWorkerError, match="has no attribute 'nope'"):
        asyncio.run(main(SPEC.replace(":behave", ":nope")))
