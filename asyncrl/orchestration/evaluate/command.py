"""``asyncrl eval``, top to bottom (the package docstring draws it): find the checkpoint,
check the inputs, start one engine, score the validation set, write ``eval.json``."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from asyncrl.core.config import cores
from asyncrl.core.runtime import rundir
from asyncrl.orchestration.evaluate.args import OUTPUT_NAME, default_run_dir
from asyncrl.orchestration.evaluate.checkpoint import (
    Checkpoint,
    find_checkpoint,
    run_config_warnings,
)
from asyncrl.orchestration.evaluate.inputs import check_inputs, validation_set
from asyncrl.orchestration.evaluate.result import Outcome, build_result, summary_lines
from asyncrl.orchestration.evaluate.stopping import EXIT_INTERRUPTED, StopSignals

EXIT_CODES = {"": 0, "timeout": 1, "interrupted": EXIT_INTERRUPTED}
"""The exit code by how the scoring ended (``Outcome.stopped``)."""


def say(text: str) -> None:
    print(f"[eval] {text}", flush=True)


def run_eval(cfg, checkpoint: str | None = None, output: str | None = None) -> int:
    """Evaluate ``checkpoint`` (``--checkpoint``; None = ``model.path``) on the task's
    validation prompts; write the result to ``output`` (``--output``; None =
    ``<run_dir>/eval.json``). Returns the exit code (``EXIT_CODES``)."""
    ckpt = find_checkpoint(checkpoint) if checkpoint else None
    if ckpt is not None:
        say(f"checkpoint {ckpt.path} (version {ckpt.version})")
        for warning in run_config_warnings(ckpt, cfg):
            say(f"warning: {warning}")
    cores.resolve(cfg, sorted(os.sched_getaffinity(0)), both_sides=False)  # auto: unpinned
    out = result_path(cfg, output)
    from asyncrl.orchestration.launch.stop_signals import import_heavy_modules

    import_heavy_modules()  # a stop during torch's import takes effect after it
    model_dir = check_inputs(cfg, ckpt)
    adapter = ckpt.adapter if ckpt else None
    if adapter is not None:
        say(f"LoRA adapter {adapter.path} (rank {adapter.rank}) on the base model {model_dir}")
    source, size = validation_set(cfg, model_dir, say)
    outcome = asyncio.run(evaluate(cfg, model_dir, source, size, ckpt))
    about = {
        "model": str(Path(model_dir).resolve()),
        "checkpoint": str(ckpt.path) if ckpt else None,
        "version": ckpt.version if ckpt else 0,
        "adapter": str(adapter.path) if adapter else None,
    }
    result = build_result(outcome, cfg, about)
    write_result(out, result, cfg)
    for line in summary_lines(result):
        say(line)
    say(f"result: {out}")
    if outcome.stopped == "interrupted":
        say("interrupted (Ctrl-C or SIGTERM): the prompts scored so far are in the result")
    elif outcome.stopped == "timeout":
        say("incomplete: eval.timeout_s passed (raise it, or lower eval.max_prompts)")
    return EXIT_CODES[outcome.stopped]


async def evaluate(cfg, model_dir: str, source, size: int, ckpt: Checkpoint | None) -> Outcome:
    """Start the engine (with ``ckpt``'s LoRA adapter, if it has one), score the set, stop
    everything; SIGINT/SIGTERM as stopping.py says (``KeyboardInterrupt`` before anything is
    scored, ``Outcome.stopped`` after)."""
    from asyncrl.orchestration.evaluate.scoring import score_prompts
    from asyncrl.orchestration.evaluate.session import open_session

    signals = StopSignals()
    stop = signals.requested.is_set
    with signals.starting():
        session = await open_session(cfg, model_dir, source, size, say, ckpt)
    with signals.scoring():
        try:
            if stop():  # a signal the start swallowed
                raise KeyboardInterrupt
            version = session.engine.version
            outcome = await score_prompts(session.validator, size, version, cfg.eval, say, stop)
        finally:
            await session.close()
    outcome.errors_by_kind = dict(session.errors_by_kind)
    return outcome


def result_path(cfg, output: str | None) -> Path:
    """``--output``, or ``eval.json`` in the run directory (``run_dir``, default
    ``runs/eval-<time>``: made and locked for ``eval``, so two evaluations never write one
    file); checked writable now, not after the evaluation."""
    if not output:
        return rundir.prepare(default_run_dir(cfg.run_dir), ("eval",)) / OUTPUT_NAME
    path = Path(output).expanduser().absolute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = path.parent / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise rundir.RunDirError(
            f"--output {output}: cannot write there ({rundir.describe_os_error(e)}); give a "
            "file in a writable directory"
        ) from None
    return path


def write_result(path: Path, result: dict, cfg) -> None:
    """``result`` with the evaluation's config (passwords masked), written atomically."""
    from asyncrl.core.config.load import config_to_json

    doc = {**result, "config": json.loads(config_to_json(cfg))}
    rundir.write_atomic(path, json.dumps(doc, indent=2) + "\n", 0o644)
