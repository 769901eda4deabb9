"""Validation in an actor: serve the learner's "validate version V" requests beside training.

Every actor runs ``Validator.run`` next to ``Actor.produce`` (actors/main.py). While a request
for version V is posted (buffer/eval_queue.py) and this actor's engine holds exactly V, it
claims chunks of the validation set (up to ``eval.prompts_in_flight`` prompts generating at
once) and, for each prompt, generates ``eval.n_samples``
completions (greedy when 1), scores them with the actor's reward pool and posts one record::

    {"index": i, "version": V, "rewards": [n floats], "lengths": [n ints],
     "extras": {key: [n floats]}, "errors": k, "off_version": m}

and, for the first ``samples`` prompts the request names (``eval.log_samples``, chosen by the
learner), ``"sample": {"prompt": str, "completion": str, "reward": float}``: the prompt text
and the first completion, decoded whole, with its reward (learner/hub/validation.py logs them).

``off_version`` counts completions with a token sampled under another version: the learner
holds weight syncs while a validation runs, so it is 0 unless that hold timed out; the
learner leaves such prompts out of the metrics and says so. Validation requests share the
engine with training groups (vLLM batches them together); they skip the staleness
admission, since they train nothing. An actor whose data ran out still validates.
"""

from __future__ import annotations

import asyncio

from asyncrl.actors.groups import generate_whole

POLL_S = 0.25
"""How often an idle validator looks for a request."""


class Validator:
    """``source.get(i)`` for ``0 <= i < size`` are the validation prompts (a pure function of
    ``i``, the same in every actor)."""

    def __init__(self, actor, source, size: int, queue, episodes=None) -> None:
        self.actor = actor
        self.episodes = episodes
        """Multi-turn: the ``EpisodeGroups`` validating with eval's sampling; None = one
        completion per sample."""
        self.cfg = actor.cfg
        self.source = source
        self.size = size
        self.queue = queue
        self.prompts_done = 0

    def _ready_for(self, request: dict | None) -> bool:
        a = self.actor
        return (
            request is not None and request["version"] == a.state.version and a.engine.weights_valid
        )

    async def run(self) -> None:
        """Serve requests until the actor stops: claim chunks while fewer than
        ``eval.prompts_in_flight`` of this actor's prompts are generating, each chunk a task
        of its own (a chunk that fails stops the actor with its error). A request whose
        ``size`` differs from this actor's validation set is refused loudly (the actors read
        different data)."""
        chunks: dict[asyncio.Task, int] = {}  # task -> its prompts
        try:
            while not self.actor.state.stop:
                for task in [t for t in chunks if t.done()]:
                    del chunks[task]
                    task.result()  # raises a chunk's error
                if sum(chunks.values()) >= self.cfg.eval.prompts_in_flight:
                    await asyncio.wait(chunks, timeout=POLL_S, return_when=asyncio.FIRST_COMPLETED)
                    continue
                span = await self._next_chunk()
                if span is None:
                    await asyncio.sleep(POLL_S)
                    continue
                span, version, samples = span
                task = asyncio.create_task(self.score_chunk(span, version, samples))
                chunks[task] = len(span)
        finally:  # the actor stops (or a chunk failed): the others are not left running
            for task in chunks:
                task.cancel()
            await asyncio.gather(*chunks, return_exceptions=True)

    async def _next_chunk(self) -> tuple[range, int, int] | None:
        """``(prompts, version, samples)`` of the next chunk this actor can validate now;
        None when no request is ready for its weights or all its prompts are handed out."""
        request = await asyncio.to_thread(self.queue.request)
        if not self._ready_for(request):
            return None
        if request["size"] != self.size:
            raise RuntimeError(
                f"the learner asks to validate {request['size']} prompts but this actor's "
                f"validation set has {self.size}: the actors were started with different "
                "data.val_files or eval.max_prompts; start every actor with the same config"
            )
        span = await asyncio.to_thread(self.queue.claim, request)
        return None if span is None else (span, request["version"], request["samples"])

    async def score_chunk(self, span: range, version: int, samples: int = 0) -> None:
        """Validate the prompts of ``span`` at once and post their records; those of prompts
        below ``samples`` carry their text."""
        records = await asyncio.gather(
            *(self.score_prompt(i, version, with_text=i < samples) for i in span)
        )
        for record in records:
            await asyncio.to_thread(self.queue.put, version, record)
        self.prompts_done += len(records)

    async def score_prompt(self, index: int, version: int, with_text: bool = False) -> dict:
        """One validation prompt -> its record (module docstring), with ``sample`` if
        ``with_text``."""
        a, e = self.actor, self.cfg.eval
        prompt = self.source.get(index)
        if self.episodes is not None:
            return await self.score_episodes(prompt, version, with_text)
        ids = prompt.token_ids
        prompt_ids = ids if ids is not None else a.tokenizer.encode(prompt.text)
        temperature = 0.0 if e.n_samples == 1 else e.temperature
        seed = (self.cfg.seed * 1_000_003 + index) % (2**31)
        completions = await generate_whole(
            a.engine, prompt_ids, e.n_samples, self.cfg.sampling.max_tokens, temperature, seed
        )
        texts = [a.tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in completions]
        scored = await a.scorer.score_all(prompt.text, texts, prompt.fields)
        extras: dict[str, list[float]] = {}
        for s in scored:
            for key, value in s.extras.items():
                extras.setdefault(key, []).append(value)
        record = {
            "index": index,
            "version": version,
            "rewards": [s.value for s in scored],
            "lengths": [len(c.token_ids) for c in completions],
            "extras": extras,
            "errors": sum(1 for s in scored if s.reason),
            "off_version": sum(1 for c in completions if set(c.token_versions) - {version}),
        }
        if with_text and texts:
            first = {"prompt": prompt.text, "completion": texts[0], "reward": scored[0].value}
            record["sample"] = first
        return record

    async def score_episodes(self, prompt, version: int, with_text: bool) -> dict:
        """One validation prompt's ``eval.n_samples`` multi-turn episodes -> its record: the
        module docstring's, ``lengths`` counting model tokens, with the episodes' ``turns``,
        ``tool_call_rate`` (0/1 per episode), ``tool_calls`` and ``truncated`` (0/1: any end
        but ``done``) among the extras; the logged sample is the whole conversation."""
        from asyncrl.actors.episodes.group import conversation_text
        from asyncrl.core.types import TRUNCATED_ENDS

        seed = (self.cfg.seed * 1_000_003 + prompt.index) % (2**31)
        group_id = f"val:{version}:{prompt.index}"
        n = self.cfg.eval.n_samples
        episodes, every = await self.episodes.run(prompt, group_id, seed, n)
        samples = [s for s in every if s.part == 0]  # one per episode (agent_export=all: more)
        extras: dict[str, list[float]] = {}
        for s in samples:
            per = {
                **s.reward_extras,
                "turns": float(s.turns),
                "tool_calls": float(s.tool_calls),
                "tool_call_rate": float(s.tool_calls > 0),
                "truncated": float(s.episode_end in TRUNCATED_ENDS),
            }
            for key, value in per.items():
                extras.setdefault(key, []).append(value)
        record = {
            "index": prompt.index,
            "version": version,
            "rewards": [s.reward for s in samples],
            "lengths": [s.model_tokens for s in samples],
            "extras": extras,
            "errors": sum(1 for s in samples if s.reward_error),
            "off_version": sum(1 for s in every if _off(s, version)),
        }
        if with_text:
            text = conversation_text(episodes[0])
            record["sample"] = {
                "prompt": prompt.text,
                "completion": text,
                "reward": samples[0].reward,
            }
        return record


def _off(sample, version: int) -> bool:
    """Whether a model token of ``sample`` was sampled under another version."""
    return any(
        v != version for v, m in zip(sample.token_versions, sample.loss_mask, strict=True) if m
    )


def validation_size(cfg, source) -> int:
    """Prompts in the validation set: ``eval.max_prompts`` of ``source`` (all of a finite one
    when 0; 64 of the endless addition task)."""
    limit = cfg.eval.max_prompts
    size = getattr(source, "size", None)
    if size is None:
        return limit or 64
    return min(size, limit) if limit else size
