"""The parts an evaluation scores with: one vLLM engine and an actor's group maker around it
(tokenizer, reward pool, multi-turn episodes), with no buffer, learner or weight sync.

``Validator.score_prompt`` (actors/validation.py) reads ``cfg``, ``engine``, ``tokenizer`` and
``scorer`` of the actor it is given; an ``asyncrl.actors.groups.GroupMaker`` has exactly those
(an actor's are its maker's), and builds the validation episodes of a multi-turn task
(``eval_episodes``), so the evaluation scores a prompt as an actor validating would.

A checkpoint of LoRA adapters alone (checkpoint.py ``Adapter``) is served as an actor serves
an adapter-only sync (actors/engine/adapters.py): LoRA on at the adapter's rank, and every
request with the one ``LoRARequest`` of the checkpoint's ``adapter/``, published as its
version ``V`` (the engine is labelled ``V`` too, so no token counts as off-version).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asyncrl.actors.engine.protocol import Engine
    from asyncrl.actors.groups import GroupMaker
    from asyncrl.actors.validation import Validator
    from asyncrl.orchestration.evaluate.checkpoint import Checkpoint

EVAL_MAX_NUM_SEQS = 256
"""Most sequences in one engine batch when ``actor.max_num_seqs`` is 0 (vLLM's own default on
a GPU): ``eval.prompts_in_flight x eval.n_samples`` below that."""


def eval_batch(cfg) -> int:
    """vLLM's ``max_num_seqs`` for an evaluation: ``actor.max_num_seqs``, or 0 = every sequence
    of the prompts in flight at once, at most ``EVAL_MAX_NUM_SEQS`` (vLLM queues the rest)."""
    e = cfg.eval
    return cfg.actor.max_num_seqs or min(e.prompts_in_flight * e.n_samples, EVAL_MAX_NUM_SEQS)


@dataclass
class Session:
    """A started engine and what scores with it; ``close()`` stops them all."""

    engine: Engine
    maker: GroupMaker
    """Tokenizer, reward scorer, episode groups."""
    validator: Validator
    """Scores one prompt of the validation set."""
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    """Failed reward calls by kind, counted by the reward scorer as they happen."""

    async def close(self) -> None:
        """Reward workers, environment processes, then the engine (each even if one before
        fails to stop)."""
        try:
            self.maker.scorer.close()
            await self.maker.close()
        finally:
            await self.engine.shutdown()


def engine_lora(ckpt: Checkpoint | None) -> dict:
    """The engine's LoRA options (``new_engine``'s ``lora``): for a checkpoint of adapters
    alone, LoRA of the adapter's rank with that adapter published as the checkpoint's version
    and the engine labelled with it; else none (an evaluation never syncs weights)."""
    if ckpt is None or ckpt.adapter is None:
        return {}
    from asyncrl.actors.engine.adapters import Adapters

    a = ckpt.adapter
    adapters = Adapters(a.rank, a.alpha)  # its own (empty) root: the checkpoint is not touched
    adapters.publish(ckpt.version, a.path)
    return {
        "adapters": adapters,
        "lora_rank": a.rank,
        "max_loras": 1,
        "initial_version": ckpt.version,
    }


async def open_session(
    cfg, model_dir: str, source, size: int, say: Callable[[str], None], ckpt: Checkpoint | None
) -> Session:
    """Start the engine for ``model_dir`` (the actor's engine options, as actors/main.py starts
    them, with the evaluation's batch; ``ckpt``'s LoRA adapter on it, ``engine_lora``), then
    the reward scorer and the group maker over ``source``'s first ``size`` prompts. The reward
    scorer counts its errors in the session."""
    from asyncrl.actors.groups import GroupMaker
    from asyncrl.actors.main import new_engine
    from asyncrl.actors.rewards.loading import load_reward_fn
    from asyncrl.actors.rewards.scoring import RewardScorer
    from asyncrl.actors.validation import Validator
    from asyncrl.core.tokenizer import load_tokenizer

    counts: dict[str, int] = {}

    def count(kind: str) -> None:
        counts[kind] = counts.get(kind, 0) + 1

    cfg.actor.max_num_seqs = eval_batch(cfg)
    lora = engine_lora(ckpt)
    try:  # prints "[actor 0] starting the vLLM engine"
        engine = await new_engine(cfg, 0, model_dir, lora)
    except BaseException:
        if "adapters" in lora:
            lora["adapters"].close()
        raise
    scorer = None
    try:
        tokenizer = load_tokenizer(model_dir)
        scorer = RewardScorer(load_reward_fn(cfg.task.reward_fn), cfg.task, say, count)
        maker = GroupMaker(cfg, 0, engine, source, tokenizer, scorer)
        await maker.start()  # episode.agent: its endpoint
    except BaseException:
        if scorer is not None:
            scorer.close()
        await engine.shutdown()
        raise
    validator = Validator(maker, source, size, None, maker.eval_episodes)
    return Session(engine, maker, validator, counts)
