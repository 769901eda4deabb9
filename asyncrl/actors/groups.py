"""Prompt -> group: an actor's ``n_samples`` whole completions of one prompt, scored, as one
``asyncrl.core.types.Group`` (what the actor commits to the buffer). With ``episode.env`` or
``episode.tools`` set each sample is a multi-turn episode instead
(``asyncrl.actors.episodes.group.EpisodeGroups``); with ``episode.agent`` set, an episode
the user's agent runs in a worker process, calling this actor's engine through an
OpenAI-compatible endpoint (asyncrl/actors/agents/)::

    GroupMaker.make -> EpisodeGroups.run -> n x AgentRun (agents/runner.py)
        -> EnvPool (module=AGENT_WORKER): the agent, given base_url and a key
             -> HTTP -> AgentServer (on this loop) -> ActorCalls -> generate_whole
        -> the exported segment -> Sample
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from asyncrl.actors.engine.protocol import Engine
from asyncrl.core.config.job import Config
from asyncrl.core.types import Group, Sample

if TYPE_CHECKING:
    from asyncrl.actors.agents.runner import AgentRun

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
        self.activity = None
        """Multi-turn: the episodes' model requests and environment calls in flight
        (``asyncrl.actors.episodes.activity.Activity``; the actor's clock reads it)."""
        self.agents: AgentRun | None = None
        """``episode.agent``: the agents' endpoint, pool and counts
        (``asyncrl.actors.agents.runner.AgentRun``); None without."""
        # multi-turn: the training episodes and validation's (eval's sampling); None without
        self.episodes, self.eval_episodes = (
            episode_groups(cfg, self) if cfg.episode.enabled else (None, None)
        )

    async def make(self, index: int, generated: Callable[[], None] = lambda: None) -> Group:
        """Prompt ``index`` -> ``n_samples`` whole completions -> rewards -> one Group.
        ``generated()`` is called once the completions are in, before scoring (the caller
        gives the engine's slot to the next prompt then).

        A reward function that fails gives its sample reward 0 and the reason in
        ``Sample.reward_error`` (counted in ``reward_errors``); the group is still committed.
        Too many failures among the recent rewards raise ``asyncrl.actors.rewards.scoring.RewardErrorRate``.
        """
        prompt = self.prompts.get(index)
        group_id = f"{self.cfg.task.seed}:{index}"
        seed = (self.cfg.seed * 1_000_003 + index) % (2**31)
        if self.episodes is not None:
            n = self.cfg.sampling.n_samples
            samples = await self.episodes.samples(prompt, group_id, seed, n)
            generated()
            return Group(group_id, index, self.actor_id, samples)
        ids = prompt.token_ids  # set by a source that tokenized it (a chat template)
        prompt_ids = ids if ids is not None else self.tokenizer.encode(prompt.text)
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
        return Group(group_id, index, self.actor_id, samples)

    async def start(self) -> None:
        """Start the agent endpoint (``episode.agent``; a no-op without) and say where."""
        if self.agents is not None:
            url = await self.agents.server.start()
            print(f"[actor {self.actor_id}] agent endpoint on {url}", flush=True)

    async def close(self) -> None:
        """Stop the agent endpoint first (its episodes end, their calls are cancelled), then
        the environment or agent processes of multi-turn episodes (a no-op without)."""
        if self.agents is not None:
            await self.agents.server.close()
        if self.episodes is not None:
            await self.episodes.host.shutdown()


def episode_groups(cfg: Config, maker: GroupMaker):
    """The multi-turn episode makers of ``maker``'s engine, tokenizer and scorer, for training
    and for validation (eval's sampling; the same environments): an environment pool
    (``episode.env_workers`` processes), the chat renderer of each tool set, the tool-call
    parser and the limits (asyncrl/actors/episodes/). An agent's: ``agent_groups``."""
    if cfg.episode.agent:
        return agent_groups(cfg, maker)
    from asyncrl.actors.episodes.activity import Activity, CountedHost
    from asyncrl.actors.episodes.env import TOOLS_ONLY
    from asyncrl.actors.episodes.env_pool import EnvPool
    from asyncrl.actors.episodes.failures import FailureGuard
    from asyncrl.actors.episodes.group import EpisodeGroups
    from asyncrl.actors.episodes.render import ChatRenderer
    from asyncrl.actors.episodes.runner import Limits, Turn
    from asyncrl.actors.episodes.tool_calls import get_parser

    e, s, tok = cfg.episode, cfg.sampling, maker.tokenizer
    maker.activity = activity = Activity()
    pool = EnvPool(
        e.env or TOOLS_ONLY, list(e.tools), e.env_workers, e.env_timeout_s, dict(e.env_kwargs)
    )
    renderers: dict[str, ChatRenderer] = {}

    def renderer(schemas: list[dict]) -> ChatRenderer:
        key = json.dumps(schemas, sort_keys=True)
        if key not in renderers:
            renderers[key] = r = ChatRenderer(tok, schemas)
            if schemas and not r.tools_in_template:
                print(
                    f"[actor {maker.actor_id}] the chat template ignores tools=: the "
                    f"{len(schemas)} tool schema(s) go into the system message, in Hermes' "
                    "format (docs/environments.md)",
                    flush=True,
                )
        return renderers[key]

    def turn(temperature: float, options: dict) -> Turn:
        async def generate(ids: list[int], max_tokens: int, seed: int):
            with activity.running("generating"):
                out = await generate_whole(
                    maker.engine, ids, 1, max_tokens, temperature, seed % (2**31), **options
                )
            return out[0]

        decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
        return Turn(generate, decode, renderer, get_parser(e.tool_parser))

    budget = e.token_budget(s.max_tokens)
    limits = Limits(e.max_turns, budget, s.max_tokens, cfg.data.max_prompt_length)
    version = lambda: maker.engine.version  # noqa: E731
    train = turn(s.temperature, s.engine_options())
    say = lambda text: print(f"[actor {maker.actor_id}] {text}", flush=True)  # noqa: E731
    what = f"episode.env={e.env}" if e.env else f"episode.tools={list(e.tools)}"
    guard = FailureGuard(e.max_env_failure_frac, e.env_failure_window, what)
    groups = EpisodeGroups(
        CountedHost(pool, activity), train, limits, maker.scorer.score_all, version, tok.eos_token_id, say=say,
        guard=guard,
    )  # fmt: skip
    ev = cfg.eval  # validation samples as it does one completion: greedy for one sample
    return groups, groups.with_turn(turn(0.0 if ev.n_samples == 1 else ev.temperature, {}))


def agent_groups(cfg: Config, maker: GroupMaker):
    """The episode makers of an agent (``episode.agent``), for training and for validation
    (eval's sampling; the same endpoint, workers and counts): the agents' worker processes
    (``episode.env_workers``, each run under ``episode.agent_timeout_s``), the endpoint over
    this actor's engine (``ActorCalls``; started by ``GroupMaker.start``), the calls' limits
    (``max_turns`` calls, the episode budget, the engine's context). Sets ``maker.agents``."""
    from asyncrl.actors.agents.agent_worker import AGENT_WORKER
    from asyncrl.actors.agents.policy import CallPolicy
    from asyncrl.actors.agents.record import CallLimits
    from asyncrl.actors.agents.runner import AgentCounts, AgentRun
    from asyncrl.actors.agents.server import AgentServer, ServerOptions
    from asyncrl.actors.data.tasks import max_model_len
    from asyncrl.actors.episodes.activity import Activity
    from asyncrl.actors.episodes.env_pool import EnvPool
    from asyncrl.actors.episodes.failures import FailureGuard
    from asyncrl.actors.episodes.group import EpisodeGroups

    e, s = cfg.episode, cfg.sampling
    maker.activity = activity = Activity()
    pool = EnvPool(
        e.agent, [], e.env_workers, e.agent_timeout_s, dict(e.agent_kwargs), module=AGENT_WORKER
    )
    options = ServerOptions(e.agent_model, e.agent_bind, e.agent_port, e.tool_parser)
    server = AgentServer(ActorCalls(maker, activity), maker.tokenizer, options)
    limits = CallLimits(e.max_turns, e.token_budget(s.max_tokens), max_model_len(cfg))
    say = lambda text: print(f"[actor {maker.actor_id}] {text}", flush=True)  # noqa: E731
    counts = AgentCounts(server.counts)
    maker.agents = run = AgentRun(
        server, pool, CallPolicy.train(s), limits, counts, e.agent_export, activity, say
    )
    guard = FailureGuard(e.max_env_failure_frac, e.env_failure_window, f"episode.agent={e.agent}")
    version = lambda: maker.engine.version  # noqa: E731
    groups = EpisodeGroups(
        pool,
        None,
        None,
        maker.scorer.score_all,
        version,
        maker.tokenizer.eos_token_id,
        say=say,
        guard=guard,
        runner=run,
    )
    return groups, groups.with_runner(run.with_policy(CallPolicy.eval(s, cfg.eval)))


class ActorCalls:
    """The agent endpoint's ``CallEngine`` (asyncrl/actors/agents/server.py) on the actor's
    engine: one whole completion per call (``generate_whole`` with n=1: a cut by an
    ``abort`` update is resubmitted), counted as ``generating`` while it runs. Cancelling
    ``complete`` cancels the engine's request."""

    def __init__(self, maker: GroupMaker, activity) -> None:
        self.maker, self.activity = maker, activity

    async def complete(self, call):
        with self.activity.running("generating"):
            out = await generate_whole(
                self.maker.engine,
                call.prompt_ids,
                1,
                call.max_tokens,
                call.temperature,
                call.seed,
                **call.options,
            )
        return out[0]


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
