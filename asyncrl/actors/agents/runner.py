"""One agent episode, from its key to its sample (``run_agent_episode``), and what an actor's
agent episodes did (``AgentCounts``, ``actor<i>.json`` ``agents``).

    open    an AgentEpisode registered with the endpoint: its key minted (AgentServer.open)
    run     in an agent worker process (EnvPool(..., module=AGENT_WORKER)): begin (the agent
            made) -> call "run" {row, base_url, api_key, model}, each under the pool's
            deadline (episode.agent_timeout_s); the agent's calls reach the endpoint meanwhile
    close   the key revoked and the calls in flight cancelled (AgentServer.end), nothing
            recorded after; then the agent's close() in its worker
    export  the segments trained (episode.agent_export) -> an episodes.runner.Episode
            (under ``all`` its ``others`` hold the call chains after the first)

How it ends (``asyncrl.core.types.EPISODE_ENDS``) and its reward (``Episode.reward``: None =
``task.reward_fn`` scores the last answer, in ``episodes.group.EpisodeGroups``)::

    max_turns / max_tokens   a call was refused by the call / token budget: the agent's
                             reward if it still returned, else 0
    agent_timeout            the run overran its deadline (a stuck worker is killed): 0
    agent_error              it raised, returned no reward, or its worker died: 0
    no_call                  it returned without a recorded call: a placeholder sample, 0
    length / done            it returned; the exported segment's last call hit its
                             max_tokens / stopped: the agent's reward

A failed episode keeps the tokens of its exported segment (trained with reward 0, a truncated
end), as an environment's failure keeps its turns.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from asyncrl.actors.agents.policy import CallPolicy
from asyncrl.actors.agents.record import AgentEpisode, CallLimits, Segment
from asyncrl.actors.agents.server import AgentServer, ServerCounts
from asyncrl.actors.agents.spec import AgentResult, AgentReturnError
from asyncrl.actors.episodes.activity import Activity
from asyncrl.actors.episodes.env_pool import EnvCrashed, EnvError, EnvTimeout
from asyncrl.actors.episodes.runner import Episode

BUDGET_ENDS = ("max_turns", "max_tokens")
"""The ends a refused call gives an episode (``record.AgentEpisode.plan``)."""
MAX_REASONS = 8
"""Failure reasons kept in ``AgentCounts.reasons`` (the first ones)."""


class AgentPool(Protocol):
    """Where agents run (``episodes.env_pool.EnvPool`` with ``module=AGENT_WORKER``)."""

    async def begin(
        self, episode_id: str, fields: dict | None = None, what: str = "open"
    ) -> dict: ...
    async def call(self, episode_id: str, op: str, fields: dict, what: str) -> dict: ...
    async def close(self, episode_id: str) -> None: ...


@dataclass
class AgentCounts:
    """What an actor's agent episodes did, validation's included (the endpoint is one).
    ``server``: the endpoint's own counts (calls by kind, refusals by reason, overrides by
    parameter, other model ids, retries), reported with these, never counted twice.

    ``ends`` by ``EPISODE_ENDS`` kind; ``causes`` of the failed ones (``raised``,
    ``bad_return``, ``crashed``, ``timeout``, ``no_call``) and the first ``MAX_REASONS``
    reasons; ``segments`` with a recorded call, of which ``segments_dropped`` were not
    exported (their ``model_tokens_dropped`` not trained); ``tool_calls`` and ``malformed``
    blocks over every recorded call."""

    server: ServerCounts
    ends: Counter = field(default_factory=Counter)
    causes: Counter = field(default_factory=Counter)
    reasons: list[str] = field(default_factory=list)
    segments: int = 0
    segments_dropped: int = 0
    model_tokens_dropped: int = 0
    tool_calls: int = 0
    malformed: int = 0

    def add(self, ep: AgentEpisode, exported: list[Segment], end: str, cause: str, why: str):
        """Count one ended episode; ``cause`` '' for one that did not fail."""
        self.ends[end] += 1
        if cause:
            self.causes[cause] += 1
            if len(self.reasons) < MAX_REASONS:
                self.reasons.append(f"{cause}: {why}")
        recorded = [s for s in ep.segments if s.calls]
        dropped = [s for s in recorded if all(s is not e for e in exported)]
        self.segments += len(recorded)
        self.segments_dropped += len(dropped)
        self.model_tokens_dropped += sum(s.traj.model_tokens for s in dropped)
        self.tool_calls += sum(c.tool_calls for c in ep.calls)
        self.malformed += sum(c.malformed for c in ep.calls)

    def to_dict(self) -> dict:
        s = self.server
        return {
            "episodes": sum(self.ends.values()),
            "ends": dict(self.ends),
            "causes": dict(self.causes),
            "reasons": list(self.reasons),
            "calls": dict(s.calls),
            "refused": dict(s.refused),
            "overridden": dict(s.overridden),
            "model_other": s.model_other,
            "retries": s.retries,
            "streamed": s.streamed,
            "segments": self.segments,
            "segments_dropped": self.segments_dropped,
            "model_tokens_dropped": self.model_tokens_dropped,
            "tool_calls": self.tool_calls,
            "malformed": self.malformed,
        }


@dataclass
class AgentRun:
    """What an actor's agent episodes share: the endpoint (started), the agents' pool, the
    calls' sampling (``policy``: training's; ``with_policy`` for validation's) and limits,
    which segment is exported, the counts, the activity (a run counts as ``env`` while the
    agent holds it, a call as ``generating``), and where the first override of each
    parameter is told (once per actor). Called as an ``EpisodeGroups`` runner."""

    server: AgentServer
    pool: AgentPool
    policy: CallPolicy
    limits: CallLimits
    counts: AgentCounts
    """Over ``server.counts`` (``AgentCounts(server.counts)``)."""
    export: str = "last"
    activity: Activity = field(default_factory=Activity)
    say: Callable[[str], None] = print
    told: set[str] = field(default_factory=set)
    """Override names told already (shared by ``with_policy``'s copy)."""

    async def __call__(self, episode_id: str, row: dict, seed: int) -> Episode:
        return await run_agent_episode(self, episode_id, row, seed)

    def with_policy(self, policy: CallPolicy) -> AgentRun:
        """The same endpoint, pool and counts, calls sampling by ``policy``."""
        return dataclasses.replace(self, policy=policy)


@dataclass(frozen=True)
class _Outcome:
    """What the agent's run came to: its checked ``result``, or (None) the failed ``end``
    with its ``cause`` and ``error``."""

    result: AgentResult | None
    end: str = ""
    cause: str = ""
    error: str = ""


async def run_agent_episode(run: AgentRun, episode_id: str, row: dict, seed: int) -> Episode:
    """One agent episode (the module docstring): its calls seeded ``seed + call index``.
    Raises only what is not the episode's to end (``EnvWorkerError``: the spec cannot load;
    a cancellation); the endpoint's episode is ended then too."""
    if not run.server.base_url:
        raise RuntimeError("the agent endpoint is not started (GroupMaker.start)")
    ep = AgentEpisode(episode_id, row, seed, run.policy, run.limits)
    key = run.server.open(ep)
    try:
        outcome = await _run(run, ep, key)
    except BaseException:
        _end(run.server, ep, "closed")
        raise
    try:
        return _finish(run, ep, outcome)
    finally:
        try:
            await run.pool.close(episode_id)  # the agent's close(), in its worker
        except (EnvTimeout, EnvError, EnvCrashed):
            pass  # counted by the pool; the episode's outcome stands


async def _run(run: AgentRun, ep: AgentEpisode, key: str) -> _Outcome:
    """The agent made and run in its worker; a failure of either as its ``_Outcome``."""
    model = run.server.options.model
    fields = {"row": ep.row, "base_url": run.server.base_url, "api_key": key, "model": model}
    try:
        with run.activity.running("env"):
            await run.pool.begin(ep.id)
            reply = await run.pool.call(ep.id, "run", fields, "run")
    except EnvTimeout as e:
        return _Outcome(None, "agent_timeout", "timeout", str(e))
    except EnvCrashed as e:
        return _Outcome(None, "agent_error", "crashed", str(e))
    except EnvError as e:
        bad = str(e).startswith(f"run: {AgentReturnError.__name__}:")
        return _Outcome(None, "agent_error", "bad_return" if bad else "raised", str(e))
    result = reply["result"]
    return _Outcome(AgentResult(result["score"], dict(result.get("extras") or {})))


def _finish(run: AgentRun, ep: AgentEpisode, out: _Outcome) -> Episode:
    """End the episode at the endpoint and export it, without an await from the end's
    choice to the export (so no call is recorded in between); counted."""
    segs = ep.exported(run.export)
    seg = segs[0] if segs else None
    end, cause, error = _end_of(ep, seg, out)
    _end(run.server, ep, end)
    reward: float | None = 0.0
    info: dict = {}
    if out.result is not None and end != "no_call":
        reward, info = out.result.score, dict(out.result.extras)  # None: reward_fn scores
    run.counts.add(ep, segs, end, cause, error)
    _tell_overrides(run, ep)
    if end == "no_call":
        return _episode(ep, None, end, reward, info, error)
    episode = _episode(ep, seg, end, reward, info, error)
    episode.others = [_episode(ep, s, end, reward, info, error) for s in segs[1:]]
    return episode


def _end_of(ep: AgentEpisode, seg: Segment | None, out: _Outcome) -> tuple[str, str, str]:
    """``(end, cause, error)``: a spent budget's end first (the agent raising at the refusal
    is its consequence, not a failure), then the run's failure, then what it recorded."""
    if ep.end in BUDGET_ENDS:
        return ep.end, "", ""
    if out.result is None:
        return out.end, out.cause, out.error
    if seg is None:
        why = f"the agent returned {out.result.score!r} without calling the model"
        return "no_call", "no_call", why
    last = ep.calls[seg.calls[-1]]
    return ("length" if last.finish_reason == "length" else "done"), "", ""


def _episode(
    ep: AgentEpisode,
    seg: Segment | None,
    end: str,
    reward: float | None,
    info: dict,
    error: str,
) -> Episode:
    """The exported ``seg`` as an ``Episode`` (None: no tokens, a placeholder). Its tool
    calls count malformed blocks as failed calls, as ``run_episode`` does."""
    if seg is None:
        return Episode(None, end, reward=reward, error=error, info=info)
    calls = [ep.calls[i] for i in seg.calls]
    return Episode(
        seg.traj,
        end,
        calls[-1].finish_reason,
        reward,
        calls[-1].text,
        tool_calls=sum(c.tool_calls + c.malformed for c in calls),
        tool_errors=sum(c.malformed for c in calls),
        error=error,
        info=info,
        opening=seg.opening,
    )


def _end(server: AgentServer, ep: AgentEpisode, end: str) -> None:
    """``server.end`` unless the server ended it already (``close``: the actor stops)."""
    if ep.id in server.episodes:
        server.end(ep.id, end)


def _tell_overrides(run: AgentRun, ep: AgentEpisode) -> None:
    """Tell the first call that asked for each parameter the run overrides."""
    for call in ep.calls:
        for name, asked in call.overrides.items():
            if name not in run.told:
                run.told.add(name)
                run.say(
                    f"an agent call asked for {name}={asked!r}; agent calls sample with the "
                    f"run's settings (counted as agents.overridden.{name}; told once)"
                )
