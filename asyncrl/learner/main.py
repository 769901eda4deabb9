"""Learner process entry point (one per torchrun rank).

    torchrun --nproc_per_node=N -m asyncrl.learner.main --run-dir RUN --model-dir MODEL
with the buffer URL in ``ASYNCRL_REDIS_URL`` (kept out of argv: it carries a password).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asyncrl.core.config.job import Config
    from asyncrl.learner.hub.hub import Hub
    from asyncrl.learner.hub.protocol import LearnerHub


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="asyncrl.learner.main")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--model-dir", required=True)
    args = p.parse_args(argv)

    from asyncrl.core.runtime import fatal
    from asyncrl.core.runtime.lifeline import enable_stack_dumps, watch_launcher

    watch_launcher()  # bounded even where a SIGTERM's handler cannot run (asyncrl/core/runtime/lifeline.py)
    enable_stack_dumps()  # kill -USR1 PID: every thread's stack in the log
    from asyncrl.buffer.connection import BufferUnavailable
    from asyncrl.core.config.load import config_from_json
    from asyncrl.learner.hub.null import NullHub
    from asyncrl.learner.trainer import StoppedUntrained, init_distributed, run_learner

    cfg = config_from_json((Path(args.run_dir) / "config.json").read_text())
    url = os.environ.get("ASYNCRL_REDIS_URL")
    if not url:
        print("learner: ASYNCRL_REDIS_URL is not set (the buffer's Redis URL)", file=sys.stderr)
        return 2
    rank, _ = init_distributed(cfg.learner.device, cfg.learner.gpu_memory_fraction)
    # rank 0 records an error a restart cannot fix (a diverged loss, a damaged buffer) for
    # the launcher
    with fatal.recorded(args.run_dir, "learner") if rank == 0 else contextlib.nullcontext():
        hub: LearnerHub
        if rank == 0:
            hub = _rank0_hub(cfg, args.run_dir, args.model_dir, url)
        else:
            hub = NullHub()  # the loop calls the same methods on every rank
            follow_rank0_on_stop()
        with tracker_runs_failed_on_error(hub):  # not left RUNNING forever by a crash
            try:
                state = run_learner(cfg, args.model_dir, args.run_dir, hub)
            except StoppedUntrained as e:
                if hub.claim_lost():
                    return _claim_lost(hub)
                hub.say(str(e))
                hub.close_log("KILLED")
                return 130
            except BufferUnavailable as e:
                if hub.claim_lost():
                    return _claim_lost(hub)
                if not hub.stop_requested():
                    raise
                # told to stop while Redis was gone (its launcher died with it): leave now;
                # what was not acked stays pending and is re-read on resume
                hub.say(f"stopped: {e}")
                hub.close_log("KILLED")
                return 143
            if hub.claim_lost():  # another learner has the buffer: not done, and its
                # actors and ledger are not ours to stop or audit (finish would do both)
                return _claim_lost(hub)
    with tracker_runs_failed_on_error(hub):
        hub.finish(state)  # summary.json, printed; closes the tracker runs FINISHED
    import torch.distributed as dist

    dist.barrier()  # the ranks leave together (rank 0 may still be writing the summary)
    dist.destroy_process_group()
    return 0


def _claim_lost(hub: LearnerHub) -> int:
    """The end of a learner whose buffer claim was taken (buffer/learner_claim.py): a
    ``FatalError`` naming the other learner (recorded; no restart), or, when the taker is a
    restarted learner of this same run, exit 1 without a fatal record (that learner goes on
    in this run directory, and a record here would fail it)."""
    from asyncrl.core.runtime.fatal import FatalError

    if not hub.claim_superseded():
        raise FatalError(hub.claim_lost())
    hub.close_log("KILLED")
    return 1


def _rank0_hub(cfg: Config, run_dir: str, model_dir: str, url: str) -> Hub:
    """Rank 0's ``asyncrl.learner.hub.hub.Hub`` (its SIGTERM/SIGINT handler asks the loop to stop)."""
    from asyncrl.learner.hub.hub import connect_hub

    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    return connect_hub(cfg, run_dir, url, vocab)


@contextlib.contextmanager
def tracker_runs_failed_on_error(hub: LearnerHub) -> Iterator[None]:
    """An exception leaving the block ends the experiment trackers' runs as ``FAILED`` (MLflow
    status, W&B exit code 1: asyncrl/core/observe/trackers.py) before it propagates; a restarted learner
    reopens the same runs. A ``NullHub`` (ranks other than 0) has nothing to close."""
    try:
        yield
    except BaseException:
        try:
            hub.close_log("FAILED")  # a no-op if the log was closed already
        except Exception as e:  # the crash is the error to show, not this one
            print(f"[learner] closing the experiment trackers failed: {e!r}", flush=True)
        raise


def follow_rank0_on_stop(grace_s: float = 60.0) -> None:
    """A SIGTERM/SIGINT does not kill a rank other than 0: rank 0 decides to stop and tells
    every rank (``trainer._rank0_flag``), so the ranks write the final checkpoint and leave
    together instead of one dying under the others' collectives (a "Connection closed by
    peer" traceback on rank 0). A rank not told within ``grace_s`` leaves anyway."""

    def on_signal(*_) -> None:
        timer = threading.Timer(grace_s, exit_now, args=(143,))
        timer.daemon = True
        timer.start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def exit_now(code: int) -> None:
    """Flush and leave without interpreter finalization: after ``destroy_process_group`` a
    rank's finalization aborted in about 1 of 20 runs here ("terminate called without an
    active exception", SIGABRT, after every rank had printed that the group was destroyed), a
    teardown race of torch's gloo threads. Everything a rank writes is closed before this."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
