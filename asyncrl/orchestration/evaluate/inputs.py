"""What an evaluation reads, checked before its engine starts (launch/preflight.py's checks,
as a launch of actors runs them): the validation data, the reward function, the episode
environment and tools, and the model directory."""

from __future__ import annotations

from collections.abc import Callable

from asyncrl.orchestration.evaluate.checkpoint import Checkpoint, check_lora_base
from asyncrl.orchestration.launch import preflight
from asyncrl.orchestration.models.directory import check_model_dir


def check_inputs(cfg, ckpt: Checkpoint | None) -> str:
    """The model directory to evaluate (``ckpt``'s export, else ``model.path`` resolved: the
    demo built or reused; for a checkpoint of LoRA adapters alone, that base once it is the one
    they were trained on), once the data's first record, ``task.reward_fn`` called with its
    fields and ``episode.*`` check out; ``ValueError``/``FileNotFoundError`` naming the key
    and the fix otherwise."""
    if cfg.actor.engine != "vllm":
        raise ValueError(
            f"actor.engine={cfg.actor.engine}: asyncrl eval scores a model's completions, and "
            "the simulator generates random tokens; leave actor.engine=vllm"
        )
    check_val_files(cfg)
    preflight.check_reward_fn(cfg)
    preflight.check_episode(cfg)
    if ckpt is None:
        return preflight.resolve_model(cfg)
    if ckpt.adapter is not None:  # LoRA adapters alone: vLLM loads them on model.path
        base = preflight.resolve_model(cfg)
        check_lora_base(ckpt, base)
        return base
    check_model_dir(ckpt.hf, "--checkpoint")
    return str(ckpt.hf)


def check_val_files(cfg) -> None:
    """A file task's ``data.val_files`` exist and have a record with the configured columns
    (the addition task generates its validation prompts)."""
    if cfg.task.name != "file":
        return
    from asyncrl.actors.data.datafile import DataKeys, first_row

    d = cfg.data
    keys = DataKeys(
        d.prompt_key, d.answer_key, d.data_source_key, d.extra_info_key, "data.val_files"
    )
    first_row(d.val_files, keys)


def validation_set(cfg, model_dir: str, say: Callable[[str], None]):
    """``(source, size)``: the task's validation prompts as the actors validate them (the
    addition task's ``eval`` split; ``data.val_files`` in file order, too-long prompts
    dropped and counted) and how many are scored (``eval.max_prompts``; 64 of the endless
    addition task). Raises ``DataError`` when prompts and answers do not fit the model."""
    from asyncrl.actors.data.tasks import TASKS, check_context, check_generated_lengths
    from asyncrl.actors.validation import validation_size

    check_context(cfg, model_dir)
    source = TASKS[cfg.task.name](cfg, model_dir, say, split="val")
    check_generated_lengths(cfg, model_dir, source)
    return source, validation_size(cfg, source)
