"""The evaluation loop: every prompt of the validation set through ``Validator.score_prompt``
(actors/validation.py: n samples, greedy for one, the reward pool, multi-turn episodes),
``eval.prompts_in_flight`` at once, with progress, a deadline and a stop.

    workers (eval.prompts_in_flight, at most one per prompt) share one index stream
      -> score_prompt(i) -> records[i]
    main: every POLL_S look at the workers; Wait.check (asyncrl/core/runtime/waiting.py)
      -> a progress line every PROGRESS_EVERY_S ("12/64 done"), TimeoutError past
         eval.timeout_s, StopRequested on Ctrl-C/SIGTERM
    a worker's error (the engine died, the reward failed too often) stops the others and
    is raised; one that comes with a stop request is the stop's doing (the terminal's
    Ctrl-C reaches vLLM's processes too) and reads as ``interrupted``

Invariant: each index in ``range(size)`` is scored at most once, and every record in the
outcome is a whole prompt's (a cut-off prompt leaves no record).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from asyncrl.core.runtime.waiting import StopRequested, Wait
from asyncrl.orchestration.evaluate.result import Outcome

POLL_S = 0.2
"""How often the loop looks at its workers, the stop flag and the deadline."""
PROGRESS_EVERY_S = 10.0
"""Seconds between two progress lines."""


async def score_prompts(
    validator,
    size: int,
    version: int,
    cfg_eval,
    say: Callable[[str], None],
    stop: Callable[[], bool],
) -> Outcome:
    """Score prompts ``0 .. size-1`` (``validator``: an ``asyncrl.actors.validation.Validator``;
    ``version``: its engine's weight label, so no token counts as off-version). Prompts below
    ``eval.log_samples`` keep their text. Returns what finished; ``Outcome.stopped`` says why
    it ended early."""
    records: dict[int, dict] = {}
    indices = iter(range(size))  # shared: each index is handed to one worker
    with_text = min(cfg_eval.log_samples, size)

    async def worker() -> None:
        for i in indices:
            records[i] = await validator.score_prompt(i, version, with_text=i < with_text)

    wait = Wait(
        f"{size} prompt(s) to be scored",
        cfg_eval.timeout_s,
        say,
        stop,
        hint="raise eval.timeout_s, or lower eval.max_prompts",
        every_s=PROGRESS_EVERY_S,
    )
    wait.begin(f"{cfg_eval.n_samples} sample(s) each, {cfg_eval.prompts_in_flight} at once")
    t0 = time.monotonic()
    workers = {asyncio.create_task(worker()) for _ in range(min(cfg_eval.prompts_in_flight, size))}
    stopped, failure = "", None
    try:
        pending = set(workers)
        while pending:
            done, pending = await asyncio.wait(
                pending, timeout=POLL_S, return_when=asyncio.FIRST_EXCEPTION
            )
            failure = next((t.exception() for t in done if t.exception()), None)
            if failure is not None:
                break
            if pending:
                wait.check(f"{len(records)}/{size} done")
    except StopRequested:
        stopped = "interrupted"
    except TimeoutError as e:  # Wait's, naming eval.timeout_s: the finished prompts stay
        say(str(e))
        stopped = "timeout"
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    if failure is not None:
        if not stop():
            raise failure
        stopped = "interrupted"
    return Outcome(records, size, time.monotonic() - t0, stopped)
