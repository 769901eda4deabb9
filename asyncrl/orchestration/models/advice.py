"""Warnings for settings far outside what a pretrained model tolerates.

The demo's values (lr 2e-4, 8-token answers) are right for its 0.75M-parameter character model
and wrong for a pretrained one: at lr 2e-4 SmolLM2-135M-Instruct sent every validation answer
to the length limit within 10 steps. The model presets (configs/model/) carry their
own values; these checks catch an override or a hand-made config that brings the toy's back.
They warn rather than refuse: a user may mean it (docs/models.md says how to choose).
"""

from __future__ import annotations

from collections.abc import Callable

from asyncrl.core.config.job import Config

MAX_PRETRAINED_LR = 1e-4
"""Far above verl's and TRL's GRPO default (1e-6) and 10x model=smollm2's 1e-5; at 2e-4
SmolLM2-135M's answers all ran to the length limit within 10 steps."""
MIN_PRETRAINED_TOKENS = 32
"""Below this, most answers of a pretrained chat model are cut at the limit."""


def reward_warnings(cfg: Config) -> list[str]:
    """A reward of the user's run inline: no isolation and no timeout (any model)."""
    from asyncrl.core.config.task import INLINE_SAFE_REWARDS

    t = cfg.task
    if t.reward_executor != "inline" or t.reward_fn in INLINE_SAFE_REWARDS:
        return []
    return [
        f"task.reward_executor=inline runs task.reward_fn={t.reward_fn} on the actor's event "
        f"loop: task.reward_timeout_s={t.reward_timeout_s:g} is not applied and a crash in it "
        "(os._exit, a segfault) kills the actor; use task.reward_executor=process (isolated, "
        "timed out) unless the reward takes microseconds"
    ]


MIN_USEFUL_LR = 1e-9
"""Below this AdamW moves a weight by less than float32 can resolve for weights near 1
(``learner.lr=1e-30`` trained silently, changing nothing)."""


def range_warnings(cfg: Config) -> list[str]:
    """Settings accepted by their bounds that still cannot do what they are for (any model)."""
    out = []
    if cfg.learner.lr < MIN_USEFUL_LR:
        out.append(
            f"learner.lr={cfg.learner.lr:g} is too small to change the weights (< "
            f"{MIN_USEFUL_LR:g}: below float32's resolution of a weight near 1): the run will "
            "train nothing; use 1e-6 .. 1e-5 for a pretrained model, 2e-4 for the demo's"
        )
    return out


def model_warnings(cfg: Config) -> list[str]:
    """Each setting of ``cfg`` that is far outside a pretrained model's range (or the demo's
    task), with the key, the value, the usual range and the fix (none for the demo model,
    which is tuned apart), after ``reward_warnings`` and ``range_warnings``."""
    out = reward_warnings(cfg) + range_warnings(cfg)
    if cfg.model.path == "demo":
        return out
    if cfg.learner.lr > MAX_PRETRAINED_LR:
        out.append(
            f"learner.lr={cfg.learner.lr:g} is far above what RL of a pretrained model "
            f"tolerates (> {MAX_PRETRAINED_LR:g}; verl and TRL default to 1e-6, model=smollm2 "
            "uses 1e-5): expect the policy to collapse; set learner.lr=1e-6 .. 1e-5 (the demo "
            "preset's 2e-4 applies unless a model preset is chosen: model=local model.path=...)"
        )
    if cfg.task.name == "addition":
        out.append(
            "task=addition is the demo's character-level sums: a pretrained model trains on them "
            "as plain text; for your own data use task=file data.train_files=[...] (or "
            "experiment=smollm2_math for the SmolLM2 example)"
        )
    if cfg.sampling.max_tokens < MIN_PRETRAINED_TOKENS:
        out.append(
            f"sampling.max_tokens={cfg.sampling.max_tokens} leaves a pretrained model almost no room "
            f"to answer (< {MIN_PRETRAINED_TOKENS} tokens): most completions will be cut at the "
            "limit (response/clip_ratio); raise sampling.max_tokens"
        )
    if cfg.model.dtype == "float16" and cfg.learner.device == "cpu":
        out.append(
            "model.dtype=float16 on a CPU learner: CPUs compute float16 slowly and it overflows "
            "where bfloat16 does not; use model.dtype=float32 or bfloat16"
        )
    return out


def placement_warnings(cfg: Config, detect: Callable[[], tuple[str, ...]]) -> list[str]:
    """A pretrained model's learner on the CPU of a node with GPUs (``detect()``: this node's
    GPUs, ``orchestration.gpus.node_gpus``; asked only for a pretrained model on a CPU
    learner): the default machine presets, ``learner=cpu actor=cpu``, are the demo's (one
    pinned torch thread, a 0.25 GiB KV cache), and a GPU job needs a layout. Nothing for the
    demo model, a GPU learner or a node without GPUs."""
    if cfg.model.path == "demo" or cfg.learner.device != "cpu":
        return []
    gpus = detect()
    if not gpus:
        return []
    return [
        f"this node has {len(gpus)} GPU(s) but learner.device=cpu: the default machine presets "
        f"(learner=cpu actor=cpu, the CPU demo's) train on {cfg.learner.cpu_threads} CPU "
        f"thread(s) and give a vLLM actor a {cfg.actor.kv_cache_gib:g} GiB KV cache; for a GPU "
        "job add layout=gpu1 (one GPU for both) or layout=node2|node4|node8, or learner=gpu "
        "actor=gpu (docs/gpu.md)"
    ]
