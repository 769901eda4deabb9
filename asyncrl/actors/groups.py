"""Prompt -> group: an actor's ``n_samples`` whole completions of one prompt, scored, as one
``asyncrl.core.types.Group`` (what the actor commits to the buffer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncrl.actors.engine.protocol import Engine
from asyncrl.core.config.job import Config
from asyncrl.core.types import Group, Sample

MAX_RESUBMITS = 10
"""update_mode=abort: a request cut by more syncs than this is an error."""


class GroupMaker:
    """Builds the groups of one actor: ``prompts.get(i)`` -> ``engine`` -> ``scorer`` (an
    ``asyncrl.actors.rewards.scoring.RewardScorer``); each token carries the version that sampled it."""

    def __init__(
        self, cfg: Config, actor_id: int, engine: Engine, prompts, tokenizer, scorer
    ) -> None:
        self.cfg, self.actor_id, self.engine = cfg, actor_id, engine
        self.prompts, self.tokenizer, self.scorer = prompts, tokenizer, scorer

    async def make(self, index: int, generated: Callable[[], None] = lambda: None) -> Group:
        """Prompt ``index`` -> ``n_samples`` whole completions -> rewards -> one Group.
        ``generated()`` is called once the completions are in, before scoring (the caller
        gives the engine's slot to the next prompt then).

        A reward function that fails gives its sample reward 0 and the reason in
        ``Sample.reward_error`` (counted in ``reward_errors``); the group is still committed.
        Too many failures among the recent rewards raise ``asyncrl.actors.rewards.scoring.RewardErrorRate``.
        """
        prompt = self.prompts.get(index)
        ids = prompt.token_ids  # set by a source that tokenized it (a chat template)
        prompt_ids = ids if ids is not None else self.tokenizer.encode(prompt.text)
        seed = (self.cfg.seed * 1_000_003 + index) % (2**31)
        s = self.cfg.sampling
        completions = await generate_whole(  # abort-mode cuts resubmitted
            self.engine,
            prompt_ids,
            s.n_samples,
            s.max_tokens,
            s.temperature,
            seed,
            **s.engine_options(),
        )
        generated()
        texts = [self.tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in completions]
        rewards = await self.scorer.score_all(prompt.text, texts, prompt.fields)  # at once
        samples = [
            Sample(
                list(prompt_ids),
                list(c.token_ids),
                list(c.logprobs),
                list(c.token_versions),
                scored.value,
                c.finish_reason,
                scored.reason,
                scored.extras,
            )
            for c, scored in zip(completions, rewards, strict=True)
        ]
        return Group(f"{self.cfg.task.seed}:{index}", index, self.actor_id, samples)


async def generate_whole(
    engine: Engine,
    prompt_ids: list[int],
    n: int,
    max_tokens: int,
    temperature: float,
    seed: int,
    **sampling: Any,
) -> list:
    """n completions, none of them aborted (``abort`` updates cut requests: resubmit them).
    ``sampling``: ``Engine.generate``'s keyword options (``top_p``, ``top_k``, ``stop``),
    passed on as given (validation passes none: it samples without them)."""
    for _ in range(MAX_RESUBMITS):
        completions = await engine.generate(
            prompt_ids, n, max_tokens, temperature, seed, **sampling
        )
        if all(c.finish_reason != "abort" for c in completions):
            return completions
    raise RuntimeError(f"a request was aborted by {MAX_RESUBMITS} weight updates in a row")
