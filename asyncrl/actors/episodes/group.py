"""Prompt -> ``n`` episodes at once -> scored ``Sample``s: the multi-turn side of
``asyncrl.actors.groups.GroupMaker`` (``episode.env``, ``episode.tools`` or ``episode.agent``
set; an agent's episodes are run by its own ``runner``, asyncrl/actors/agents/runner.py).

The ``n`` episodes of a prompt run concurrently (``runner.run_episode``); each becomes one
``Sample`` whose response holds every turn (``loss_mask`` 1 on the model's tokens), followed
by one per other call chain an agent's episode kept (``Episode.others``, ``Sample.part`` 1,
2, ...; ``episode.agent_export=all``) with the same reward. Its reward
is the environment's (the sum of its steps' rewards; an ``info``'s numbers become the sample's
``reward_extras``), or, when the environment gave none, ``task.reward_fn`` on the last answer,
scored for all such episodes of the group at once. An episode the environment ended
(``env_timeout``, ``env_error``) keeps what its steps gave, else 0. One that ended before its
first model turn has no tokens: it becomes a placeholder of one end-of-sequence token that
trains nothing (``loss_mask`` 0) with reward 0, so the group keeps its ``n`` samples and the
failure is counted, not dropped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from asyncrl.actors.episodes.failures import FAILED_ENDS as _FAILED_ENDS
from asyncrl.actors.episodes.failures import FailureGuard
from asyncrl.actors.episodes.runner import EnvHost, Episode, Limits, Turn, run_episode
from asyncrl.core.types import MAX_REWARD_EXTRAS, Sample

Runner = Callable[[str, dict, int], Awaitable[Episode]]
"""``runner(episode_id, row, seed) -> Episode``: one episode run to its end (an agent's:
asyncrl/actors/agents/runner.py); the default is ``run_episode`` on the group's host."""


@dataclass
class EpisodeCounts:
    """What the episodes of one actor did (``actor<i>.json``, the actor's log)."""

    episodes: int = 0
    ends: Counter = field(default_factory=Counter)
    """Episodes by ``asyncrl.core.types.EPISODE_ENDS`` kind."""
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    env_failures: list[str] = field(default_factory=list)
    """The first few reasons an environment ended an episode (``env_timeout``/``env_error``)."""
    parts: int = 0
    """An agent's other call chains made samples (``episode.agent_export=all``)."""
    parts_dropped: int = 0
    """Other call chains not trained: their prompts share no first token with the group's."""

    @property
    def failures(self) -> int:
        """Episodes an environment ended (``env_timeout``, ``env_error``)."""
        return sum(self.ends[k] for k in _FAILED_ENDS)

    def add(self, e: Episode) -> None:
        self.episodes += 1
        self.ends[e.end] += 1
        self.turns += e.trajectory.turns if e.trajectory else 0
        self.tool_calls += e.tool_calls
        self.tool_errors += e.tool_errors
        if e.error and len(self.env_failures) < 8:
            self.env_failures.append(f"{e.end}: {e.error}")

    def to_dict(self) -> dict:
        return {
            "episodes": self.episodes,
            "ends": dict(self.ends),
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
            "env_failures": list(self.env_failures),
            "parts": self.parts,
            "parts_dropped": self.parts_dropped,
        }


@dataclass
class EpisodeGroups:
    """Builds the samples of one prompt's ``n`` episodes (see the module docstring).

    ``score(prompt_text, texts, fields)`` is the task's reward scorer
    (``RewardScorer.score_all``); ``version()`` the engine's weight version now (the
    placeholder of an episode with no tokens carries it); ``eos_id`` the placeholder token.
    ``host`` holds the episodes' worker processes (``shutdown()`` at the end); ``turn`` and
    ``limits`` drive ``run_episode``, unless a ``runner`` runs each episode instead (an
    agent's: then they are None).
    """

    host: EnvHost
    turn: Turn | None
    limits: Limits | None
    score: Callable[..., Any]
    version: Callable[[], int]
    eos_id: int
    counts: EpisodeCounts = field(default_factory=EpisodeCounts)
    say: Callable[[str], None] = print
    """Where an environment failure is told: the first 3, then the 10th, 100th, ..."""
    guard: FailureGuard | None = None
    """Fails the run once too many recent episodes failed (``failures.py``); None = never.
    Shared with ``with_turn``'s copy: validation's episodes count too."""
    runner: Runner | None = None
    """Runs each episode in place of ``run_episode(host, turn, limits, ...)``."""

    async def samples(self, prompt, group_id: str, seed: int, n: int) -> list[Sample]:
        """``n`` episodes of ``prompt`` (an ``asyncrl.actors.data.prompt.Prompt``) at once,
        episode ``j`` seeded ``seed + j * 1009`` (its turn ``t``: ``+ t``)."""
        return (await self.run(prompt, group_id, seed, n))[1]

    async def run(
        self, prompt, group_id: str, seed: int, n: int
    ) -> tuple[list[Episode], list[Sample]]:
        """``samples``, with the episodes they came from (their conversations)."""
        row = {**prompt.fields, "prompt": prompt.text}
        if prompt.messages is not None:  # a chat prompt: the episode starts from its messages
            row["messages"] = [dict(m) for m in prompt.messages]
        runner = self.runner if self.runner is not None else self._run_episode
        runs = [  # each episode's row says which of the n it is (per-episode determinism)
            runner(f"{group_id}:{j}", {**row, "episode": j, "group_id": group_id}, seed + j * 1009)
            for j in range(n)
        ]
        episodes = list(await asyncio.gather(*runs))
        for e in episodes:
            self.counts.add(e)
            n = self.counts.failures
            if e.error and (n <= 3 or str(n).rstrip("0") == "1"):
                self.say(f"episode {e.end} ({n} of {self.counts.episodes} so far): {e.error}")
            if self.guard is not None:
                self.guard.add(e.end, e.error)
        return episodes, await self._scored(prompt, episodes)

    def with_turn(self, turn: Turn) -> EpisodeGroups:
        """The same environments and limits, generating with ``turn`` (validation's sampling)
        and counting apart."""
        return dataclasses.replace(self, turn=turn, counts=EpisodeCounts())

    def with_runner(self, runner: Runner) -> EpisodeGroups:
        """The same host, each episode run by ``runner`` (validation's), counting apart."""
        return dataclasses.replace(self, runner=runner, counts=EpisodeCounts())

    async def _run_episode(self, episode_id: str, row: dict, seed: int) -> Episode:
        if self.turn is None or self.limits is None:
            raise ValueError("EpisodeGroups without a runner needs a turn and limits")
        return await run_episode(self.host, self.turn, self.limits, episode_id, row, seed)

    async def _scored(self, prompt, episodes: list[Episode]) -> list[Sample]:
        ask = [
            i
            for i, e in enumerate(episodes)
            if e.reward is None and e.trajectory is not None and e.end not in _FAILED_ENDS
        ]
        scored = await self.score(
            prompt.text, [episodes[i].last_answer for i in ask], prompt.fields
        )
        by_index = dict(zip(ask, scored, strict=True))
        prompt_ids = _common_prefix([e.trajectory.prompt_ids for e in episodes if e.trajectory])
        others = [self._others(e, prompt_ids) for e in episodes]
        prompts = [t.trajectory.prompt_ids for o in others for t in o if t.trajectory]
        prompt_ids = _common_prefix([prompt_ids, *prompts]) if prompt_ids else prompt_ids
        samples = []
        for i, e in enumerate(episodes):
            s = by_index.get(i)
            reward = s.value if s else (e.reward or 0.0)
            error, extras = (s.reason, s.extras) if s else ("", _numbers(e.info))
            for k, part in enumerate([e, *others[i]]):  # an agent's other call chains follow
                samples.append(self._sample(part, prompt_ids, reward, error, extras, k))
        return samples

    def _others(self, e: Episode, prompt_ids: list[int]) -> list[Episode]:
        """``e.others`` whose prompts open with the group prompt's first token (a group has
        one prompt: a chain sharing no token with it cannot be a row of the group); the
        others are counted in ``parts_dropped`` and told (the first, then the 10th, ...)."""
        first = prompt_ids[:1]
        kept = [o for o in e.others if o.trajectory and o.trajectory.prompt_ids[:1] == first]
        dropped = len(e.others) - len(kept)
        self.counts.parts += len(kept)
        if dropped:
            self.counts.parts_dropped += dropped
            n = self.counts.parts_dropped
            if n == dropped or str(n).rstrip("0") == "1":
                self.say(
                    f"{n} call chain(s) of agent episodes not trained so far: their prompts "
                    "share no first token with their group's (a sub-agent rendered through "
                    "another chat template?); counted as episodes.parts_dropped"
                )
        return kept

    def _sample(
        self, e: Episode, prompt_ids: list[int], reward: float, error: str, extras, part: int = 0
    ) -> Sample:
        """One episode as a ``Sample`` of the group prompt ``prompt_ids``: what its own first
        prompt holds beyond it (an environment may open each episode differently) leads its
        response, masked, with the version of its first model token."""
        t = e.trajectory
        if t is None:  # nothing generated: a placeholder that trains nothing
            v = self.version()
            return Sample(prompt_ids or [self.eos_id], [self.eos_id], [0.0], [v], 0.0, "stop",
                          loss_mask=[0], episode_end=e.end)  # fmt: skip
        lead = t.prompt_ids[len(prompt_ids) :]
        k = len(lead)
        return Sample(
            list(prompt_ids),
            lead + list(t.ids),
            [0.0] * k + list(t.logprobs),
            t.versions[:1] * k + list(t.versions),
            reward,
            e.finish_reason,
            error,
            extras,
            loss_mask=[0] * k + list(t.mask),
            turns=t.turns,
            tool_calls=e.tool_calls,
            tool_errors=e.tool_errors,
            episode_end=e.end,
            part=part,
        )


def _common_prefix(prompts: list[list[int]]) -> list[int]:
    """The longest prefix all ``prompts`` share; ValueError when they share no token (a
    group needs a prompt of one token at least)."""
    if not prompts:
        return []
    first, n = prompts[0], min(len(p) for p in prompts)
    k = next((i for i in range(n) if any(p[i] != first[i] for p in prompts)), n)
    if k == 0:
        raise ValueError(
            "the episodes of one prompt open with prompts that share no first token; an "
            "environment's reset must render through the same chat template"
        )
    return list(first[:k])


def _numbers(info: dict) -> dict[str, float]:
    """An ``info``'s finite numbers (bools as 0/1), at most ``MAX_REWARD_EXTRAS``."""
    out: dict[str, float] = {}
    for k, v in info.items():
        number = isinstance(v, bool | int | float) and math.isfinite(float(v))
        if isinstance(k, str) and k and number and len(out) < MAX_REWARD_EXTRAS:
            out[k] = float(v)
    return out


def conversation_text(e: Episode) -> str:
    """An episode after its first messages, one ``role: content`` line per message (model
    turns as decoded, tool calls included): what a logged validation sample shows."""
    if e.trajectory is None:
        return f"[no model turn: {e.end}: {e.error}]"
    later = e.trajectory.messages[e.opening :]
    return "\n".join(f"{m['role']}: {m['content']}" for m in later)
