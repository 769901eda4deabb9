"""Prompt sources: deterministic, indexable streams of task prompts.

The task registry (``TASKS``, the values ``task.name`` takes): ``addition`` (this module) and
``file`` (prompts from dataset files: actors/data/file_source.py). ``build_prompt_source(cfg,
model_dir)`` builds the configured one; every source has ``get(index) -> Prompt`` (a pure
function of the index), ``end`` (the first index past its data; None = endless) and
``epoch_of(index)``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from asyncrl.actors.data.addition import AdditionSource
from asyncrl.core.config.job import derived_max_model_len


def _file_source(cfg, model_dir: str, log=print, split="train"):
    from asyncrl.actors.data.file_source import FileSource

    return FileSource.from_config(cfg, model_dir, log, split=split)


TASKS: dict[str, Callable] = {"addition": AdditionSource.from_config, "file": _file_source}
"""``task.name`` -> ``factory(cfg, model_dir, log, split="train" | "val")``; asyncrl/core/config/job.py ``_TASKS`` repeats the
names (it imports no actor code) and tests/unit/core/test_config.py checks they match."""


def build_prompt_source(cfg, model_dir: str, log: Callable[[str], None] = print):
    """The prompt source ``task.name`` names, built for the model in ``model_dir``, after
    checking that prompts and responses fit the model's context. Raises
    ``asyncrl.actors.data.datafile.DataError`` naming the key and the fix for any unusable input."""
    check_context(cfg, model_dir)
    if cfg.task.name not in TASKS:  # the config refuses it first; this is the seam's own check
        raise ValueError(f"task.name={cfg.task.name!r}; known tasks: {', '.join(TASKS)}")
    return TASKS[cfg.task.name](cfg, model_dir, log)


def build_val_source(cfg, model_dir: str, log: Callable[[str], None] = print):
    """The validation prompts of ``task.name`` (``data.val_files``, file order, one pass; the
    addition task's ``eval`` split), or None when ``eval`` validates nothing."""
    if not cfg.eval.enabled:
        return None
    return TASKS[cfg.task.name](cfg, model_dir, log, split="val")


def max_model_len(cfg) -> int:
    """vLLM's ``max_model_len``: ``actor.max_model_len`` when set (the config checked that it
    holds the data), else the longest prompt kept plus the longest response."""
    return cfg.actor.max_model_len or derived_max_model_len(cfg)


def check_context(cfg, model_dir: str) -> None:
    """``max_model_len(cfg)`` must fit the model's context (``max_position_embeddings`` in its
    config.json, or its ``text_config``'s); a config without it is left to vLLM's own check."""
    from asyncrl.actors.data.datafile import DataError

    path = Path(model_dir) / "config.json"
    try:
        mc = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # the launcher checks the model directory itself (orchestration/launch/preflight.py)
    context = mc.get("max_position_embeddings") or (mc.get("text_config") or {}).get(
        "max_position_embeddings"
    )
    if isinstance(context, int) and max_model_len(cfg) > context:
        a = cfg.actor
        if a.max_model_len:
            length, lower = f"actor.max_model_len={a.max_model_len}", "actor.max_model_len"
        else:
            length = (
                f"data.max_prompt_length={cfg.data.max_prompt_length} + sampling.max_tokens="
                f"{cfg.sampling.max_tokens} = {max_model_len(cfg)}"
            )
            lower = "data.max_prompt_length or sampling.max_tokens"
        raise DataError(
            f"{length} tokens exceeds the model's context (max_position_embeddings={context} "
            f"in {path}); lower {lower}"
        )


def example_fields(cfg) -> dict:
    """The reward fields of the task's first record (no tokenizer needed), for checking the
    reward function's signature before the model is built."""
    if cfg.task.name != "file":
        return TASKS[cfg.task.name](cfg, "").get(0).fields
    from asyncrl.actors.data.datafile import DataKeys, first_row

    d = cfg.data
    keys = DataKeys(d.prompt_key, d.answer_key, d.data_source_key, d.extra_info_key)
    return first_row(d.train_files, keys).fields if d.train_files else {}


GENERATED_CHECKED = 64
"""How many prompts of a generated task (``addition``) ``check_generated_lengths`` measures."""


def check_generated_lengths(cfg, model_dir: str, source) -> None:
    """A generated task's prompts (no file: nothing drops long ones at load) must fit
    ``data.max_prompt_length``, which sizes vLLM's context: ``data.max_prompt_length=1`` on
    the addition task made it 9 tokens and cut 94% of the completions, silently. Measures
    the first ``GENERATED_CHECKED`` prompts' text with the model's tokenizer (a chat template
    only adds tokens, so a prompt this finds too long is too long)."""
    if source.end is not None:  # file data: too-long prompts are dropped at load, counted
        return
    from asyncrl.actors.data.datafile import DataError
    from asyncrl.core.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    prompts = [source.get(i).text for i in range(GENERATED_CHECKED)]
    longest = max(len(tokenizer(p)["input_ids"]) for p in prompts)
    limit = cfg.data.max_prompt_length
    if longest > limit:
        raise DataError(
            f"data.max_prompt_length={limit} is shorter than task={cfg.task.name}'s prompts "
            f"(up to {longest} tokens among its first {GENERATED_CHECKED}); it sizes vLLM's "
            "context (data.max_prompt_length + sampling.max_tokens), so completions would be "
            f"cut; raise data.max_prompt_length to at least {longest} (or leave its default)"
        )


def check_data(cfg, model_dir: str, log: Callable[[str], None] = print) -> None:
    """Load the task's prompts as an actor will (and ``data.val_files``), so bad input fails
    before any process starts; say how far the data goes in learner steps."""
    source = build_prompt_source(cfg, model_dir, log)
    check_generated_lengths(cfg, model_dir, source)
    if cfg.data.val_files:
        from asyncrl.actors.data.file_source import FileSource

        FileSource.from_config(cfg, model_dir, log, split="val")
    if source.end is None:
        return
    from asyncrl.actors.data.datafile import DataError

    steps, b = source.end // cfg.learner.batch_groups, cfg.learner.batch_groups
    if steps == 0:
        raise DataError(
            f"data.train_files: {source.size} prompts x data.epochs={cfg.data.epochs} make "
            f"{source.end} groups, fewer than one learner step (learner.batch_groups={b}); "
            "give more data or epochs, or lower learner.batch_groups"
        )
    if steps < cfg.learner.steps:
        log(
            f"the data makes {source.end} groups, enough for at most {steps} of learner.steps="
            f"{cfg.learner.steps} steps (batch_groups={b}): the run ends when it runs out"
        )
