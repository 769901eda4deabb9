"""A reward worker process: ``python -m asyncrl.actors.rewards.worker SPEC STACK_FILE``.

Started by ``asyncrl.actors.rewards.scoring`` (``task.reward_executor=process``), one per worker slot. It
loads the reward function by ``SPEC`` itself (``asyncrl.actors.rewards.loading.load_reward_fn``), then reads
one JSON request per line on stdin and writes one JSON reply per line on stdout, one call
at a time, in its main thread::

    -> {"ready": true}                       once loaded; or {"error": "..."} and exit 1
    <- {"id": 7, "prompt": "...", "completion": "...", "fields": {...}}
    -> {"id": 7, "value": 0.5, "kind": "", "reason": "", "detail": "", ...}   (``Scored``'s fields)
    -> {"id": 7, "sandbox": "..."}           ``SandboxError``: the actor re-raises it

JSON only (no pickle on any wire). The reply channel is a private copy of stdout: file
descriptor 1 is pointed at stderr before the function is loaded, so whatever the reward
prints lands in the actor's log instead of corrupting the replies. ``SIGUSR1`` dumps every
thread's stack into ``STACK_FILE`` (``faulthandler``, which works even while the call is
stuck in C code): the actor asks for it before killing a call past its deadline. The worker
exits at end of input; the actor kills it (SIGKILL, its whole process group) on a timeout
and at shutdown, and ``asyncrl.core.runtime.lifeline`` makes it die with the actor.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import os
import signal
import sys
import traceback

MEMORY_ENV = "ASYNCRL_REWARD_MEMORY_MB"
"""``task.reward_memory_mb`` for this worker (set by the pool: actors/rewards/pool.py)."""


def limit_memory() -> int:
    """Apply ``RLIMIT_DATA`` from ``MEMORY_ENV`` (MiB; <= 0 or unset: none), never above the
    hard limit this process inherited (``ulimit -d``); returns the MiB applied (0: none)."""
    import resource

    mb = int(os.environ.get(MEMORY_ENV, "0") or 0)
    if mb <= 0:
        return 0
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    want = mb << 20 if hard == resource.RLIM_INFINITY else min(mb << 20, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (want, hard))
    return want >> 20


_OUT_OF_MEMORY = ("MemoryError", "Unable to allocate", "can't allocate memory", "out of memory")
"""How running out of memory reads in an error: Python's MemoryError, numpy's
_ArrayMemoryError ("Unable to allocate"), torch's ("can't allocate memory")."""


def memory_hint(text: str, mb: int) -> str:
    """``text`` (a failed call's reason, or a load error) with the limit named when it says
    the worker ran out of memory under it."""
    if mb and any(mark in text for mark in _OUT_OF_MEMORY):
        return (
            f"{text} (the worker's memory limit is task.reward_memory_mb={mb} MiB: raise it, "
            "or -1 for none)"
        )
    return text


def main(argv: list[str]) -> int:
    spec, stack_file = argv
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # the reward's prints go to the actor's log, not into the replies
    sys.stdout = sys.stderr
    stacks = open(stack_file, "w")  # noqa: SIM115 (open for the life of the process)
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)

    from asyncrl.actors.rewards.calls import score_call
    from asyncrl.actors.rewards.loading import load_reward_fn
    from asyncrl.actors.rewards.sandbox import SandboxError

    def reply(obj: dict) -> None:
        replies.write(json.dumps(obj) + "\n")
        replies.flush()

    mb = limit_memory()
    try:
        fn = load_reward_fn(spec)
    except Exception as e:  # ValueError naming the spec and the fix, or an import failure
        reply({"error": memory_hint(f"{e}\n{traceback.format_exc()}", mb)})
        return 1
    reply({"ready": True})
    for line in sys.stdin.buffer:  # JSON is ASCII (non-ASCII text arrives escaped)
        req = json.loads(line)
        try:
            s = score_call(fn, req["prompt"], req["completion"], req["fields"])
            if s.kind == "raised":
                s = dataclasses.replace(s, reason=memory_hint(s.reason, mb))
        except SandboxError as e:
            reply({"id": req["id"], "sandbox": str(e)})
            continue
        reply({"id": req["id"], **dataclasses.asdict(s)})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
