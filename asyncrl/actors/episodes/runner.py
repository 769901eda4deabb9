"""One episode: the model's turns against an environment and its tools, token for token.

    open (env.reset(row) -> messages, tool schemas) -> prompt_ids (the chat template)
    turn:  generate from prompt + response so far (at most what the budget leaves)
           -> the model's tokens appended as sampled (mask 1, their log-probs and versions)
           -> tool calls in its text?  yes: each call answered by the tools (errors as text)
                                       no:  env.step(assistant message) -> messages, reward, done
           -> the answers appended as the template renders them (mask 0)
    until  done | max_turns | the token budget | the last turn hit sampling.max_tokens
           | an environment call overran (env_timeout) or failed (env_error)

Each turn is one engine request, so a weight update that lands between turns or inside one
(``update_mode=keep``) leaves every token with the version that sampled it; an ``abort`` cut
resubmits that turn (``asyncrl.actors.groups.generate_whole``). Many episodes run at once on
one engine: while one waits for its tools, the others generate.

An ``Episode`` is the outcome: the trajectory, the environment's reward (the sum of its
steps' rewards; None when it gave none: the task's reward function then scores the last
answer), how it ended (``asyncrl.core.types.EPISODE_ENDS``) and its tool counts. An episode
that ends before its first model turn (``reset`` failed) has no tokens: ``trajectory`` is
None and its group holds a one-token placeholder that trains nothing (``episodes/group.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from asyncrl.actors.episodes.env import StepResult
from asyncrl.actors.episodes.env_pool import EnvCrashed, EnvError, EnvTimeout
from asyncrl.actors.episodes.tool_calls import ParsedTurn, ToolCall
from asyncrl.actors.episodes.tools import ToolResult
from asyncrl.actors.episodes.trajectory import Trajectory


class EnvHost(Protocol):
    """Where an episode's environment lives (``asyncrl.actors.episodes.env_pool.EnvPool``)."""

    async def open(self, episode_id: str, row: dict) -> tuple[list[dict], list[dict]]: ...
    async def step(self, episode_id: str, message: dict) -> StepResult: ...
    async def tool(self, episode_id: str, call: ToolCall) -> ToolResult: ...
    async def close(self, episode_id: str) -> None: ...


@dataclass(frozen=True)
class Limits:
    """Where an episode stops: ``max_turns`` model turns, ``budget`` response tokens,
    ``turn_tokens`` per model turn (``sampling.max_tokens``), ``prompt_tokens`` for the
    first prompt (``data.max_prompt_length``: the engine's context holds no more)."""

    max_turns: int
    budget: int
    turn_tokens: int
    prompt_tokens: int


@dataclass
class Episode:
    """One episode's outcome (see the module docstring)."""

    trajectory: Trajectory | None
    end: str
    """One of ``asyncrl.core.types.EPISODE_ENDS``."""
    finish_reason: str = "stop"
    """The last model turn's (``asyncrl.core.types.FINISH_REASONS``)."""
    reward: float | None = None
    """Sum of the environment's step rewards; None when no step gave one."""
    last_answer: str = ""
    """The last model turn's text (what ``task.reward_fn`` scores when ``reward`` is None)."""
    tool_calls: int = 0
    tool_errors: int = 0
    error: str = ""
    """Why the environment ended it (``env_timeout`` / ``env_error``), else ''."""
    info: dict = field(default_factory=dict)
    """The last step's ``info``."""
    opening: int = 0
    """How many of ``trajectory.messages`` are the first messages (``reset``'s)."""
    others: list[Episode] = field(default_factory=list)
    """An agent's other call chains (``episode.agent_export=all``), each with its own
    trajectory, sharing this one's end and reward: samples ``part`` 1, 2, ... of it."""


@dataclass
class Turn:
    """What one episode's runner needs besides the environment: the engine's generate
    (``generate(ids, max_tokens, seed) -> Completion``), the tokenizer's decode, the chat
    renderer for a set of tool schemas, and the tool-call parser."""

    generate: Callable[[list[int], int, int], Any]
    decode: Callable[[list[int]], str]
    renderer: Callable[[list[dict]], Any]
    parse: Callable[[str], ParsedTurn]


async def run_episode(
    host: EnvHost, turn: Turn, limits: Limits, episode_id: str, row: dict, seed: int
) -> Episode:
    """Run one episode to its end; the environment is closed whatever happens."""
    try:
        return await _run(host, turn, limits, episode_id, row, seed)
    finally:
        try:
            await host.close(episode_id)
        except (EnvTimeout, EnvError, EnvCrashed):
            pass  # already counted by the host; the episode's outcome stands


async def _run(
    host: EnvHost, turn: Turn, limits: Limits, episode_id: str, row: dict, seed: int
) -> Episode:
    try:
        messages, schemas = await host.open(episode_id, row)
    except (EnvTimeout, EnvError, EnvCrashed) as e:
        return Episode(None, _end_of(e), error=f"reset: {e}")
    renderer = turn.renderer(schemas)
    prompt_ids = renderer.prompt_ids(messages)
    if len(prompt_ids) > limits.prompt_tokens:
        reason = (
            f"reset's messages render to {len(prompt_ids)} tokens, over data.max_prompt_length="
            f"{limits.prompt_tokens}: raise it or shorten the environment's first messages"
        )
        return Episode(None, "env_error", error=reason)
    traj = Trajectory(prompt_ids, list(messages))
    out = Episode(traj, "max_turns", opening=len(messages))
    for t in range(limits.max_turns):
        left = limits.budget - len(traj.ids)
        c = await turn.generate(prompt_ids + traj.ids, min(limits.turn_tokens, left), seed + t)
        text = turn.decode(c.token_ids)
        traj.add_model_turn(c.token_ids, c.logprobs, c.token_versions, text)
        out.finish_reason, out.last_answer = c.finish_reason, text
        if c.finish_reason == "length":
            out.end = "length" if left > limits.turn_tokens else "max_tokens"
            return out
        try:
            new, done = await _answer(host, turn.parse(text), episode_id, text, out)
        except (EnvTimeout, EnvError, EnvCrashed) as e:
            out.end, out.error = _end_of(e), f"step: {e}"
            return out
        if done:
            out.end = "done"
            return out
        if t + 1 == limits.max_turns:
            return out  # max_turns
        delta = renderer.delta_ids(new, traj.ids)
        if len(traj.ids) + len(delta) >= limits.budget:
            out.end = "max_tokens"
            return out
        traj.add_messages(new, delta)
    return out


async def _answer(
    host: EnvHost, parsed: ParsedTurn, episode_id: str, text: str, out: Episode
) -> tuple[list[dict], bool]:
    """The messages that answer one model turn, and whether the episode is done: the tools'
    answers when it called any (each call at once, errors as text), else the environment's
    step. A malformed call is answered with its error, as a failed tool call."""
    if parsed.calls or parsed.malformed:
        results = await asyncio.gather(*(host.tool(episode_id, c) for c in parsed.calls))
        out.tool_calls += len(parsed.calls) + len(parsed.malformed)
        out.tool_errors += sum(r.error is not None for r in results) + len(parsed.malformed)
        answers = [{"role": "tool", "name": r.name, "content": r.content} for r in results]
        answers += [{"role": "tool", "content": f"Error: {m}"} for m in parsed.malformed]
        return answers, False
    step = await host.step(episode_id, {"role": "assistant", "content": text})
    if step.reward is not None:
        out.reward = (out.reward or 0.0) + step.reward
    out.info = step.info
    return step.messages, step.done


def _end_of(e: Exception) -> str:
    return "env_timeout" if isinstance(e, EnvTimeout) else "env_error"
