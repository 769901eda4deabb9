"""One agent episode's calls as token-exact trajectories: plan, record, export. No I/O.

A call's messages are matched against the calls answered so far (``messages.prefix_hashes``;
``ends`` maps the hash of each answered conversation, the reply included, to where its tokens
end), then its prompt is built from recorded tokens, never from a re-encoded reply:

    extend  the longest answered prefix ends where its segment ends now: the prompt is that
            segment's tokens + ``delta_ids(rest)`` (the template's tokens for the new
            messages, mask 0), and the reply extends the segment
    fork    it ends earlier (a branch, a retry, a concurrent call): a new segment whose prompt
            is the earlier tokens up to that point + ``delta_ids(rest)``
    first / new   no answered prefix: ``renderer.prompt_ids(messages)`` (an assistant message
            never returned, edited or invented, is rendered: what the agent asked to be read)

Matching and claiming happen without an await between them, and a segment with a call in
flight is ``busy``, so two concurrent calls never both extend one segment (the second forks).

    Segment.traj   prompt_ids [P] | ids [C]: call 1 | delta (mask 0) | call 2 | ...
    CallRecord     one HTTP call: its kind, segment, offsets and outcome; tokens live in
                   its segment's ``traj`` only
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from asyncrl.actors.agents.messages import (
    Message,
    Refused,
    canon,
    chain,
    prefix_hashes,
    template_message,
    tools_key,
)
from asyncrl.actors.agents.policy import CallPolicy, CallSettings
from asyncrl.actors.engine.completions import Completion
from asyncrl.actors.episodes.render import ChatRenderer
from asyncrl.actors.episodes.trajectory import Trajectory

EXPORT_MODES = ("last", "longest", "first", "all")
"""``episode.agent_export``: the segments trained (``AgentEpisode.exported``)."""


@dataclass(frozen=True)
class CallLimits:
    """An episode's bounds: ``max_calls`` calls (``episode.max_turns``), ``budget`` tokens
    in all (model tokens and extend deltas, ``episode.max_tokens``), ``context`` tokens per
    prompt + completion (the engine's ``max_model_len``)."""

    max_calls: int
    budget: int
    context: int


@dataclass
class CallRecord:
    """One HTTP call, in call order; its tokens live in its segment's trajectory."""

    index: int
    kind: str
    """``first`` | ``extend`` | ``fork`` | ``new``; its seed is the episode's + ``index``."""
    segment: int
    turn: int
    """Which model turn of its segment's trajectory it sampled."""
    prompt_len: int
    """Tokens it was conditioned on."""
    delta: int
    """Template tokens added to its segment before it (extend; mask 0)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    finish_reason: str = ""
    """``stop`` | ``length``; ``abort`` if it never finished (cancelled, failed)."""
    text: str = ""
    message: dict[str, Any] = field(default_factory=dict)
    """The reply as returned, canonical (``messages.canon``)."""
    tool_calls: int = 0
    malformed: int = 0
    t0: float = 0.0
    t1: float = 0.0


@dataclass
class Segment:
    """One trajectory: a chain of calls, each extending the last. ``opening``: messages of
    its first prompt; ``forked_from``: (segment, token offset) its prompt was taken from;
    ``calls``: the recorded calls in it, in order; ``busy``: a call is in flight on it."""

    traj: Trajectory
    tools_key: str
    opening: int
    forked_from: tuple[int, int] | None = None
    calls: list[int] = field(default_factory=list)
    busy: bool = False


@dataclass
class Reply:
    """What the endpoint returns for a completion: the decoded ``text``, the assistant
    ``message`` (OpenAI's shape), and the counts of tool calls and malformed blocks."""

    text: str
    message: dict[str, Any]
    tool_calls: int = 0
    malformed: int = 0


@dataclass
class Plan:
    """One call between its match and its record: ``prompt_ids`` [P] to generate from, at
    most ``max_new`` tokens; for an extend, ``suffix`` messages and their ``delta`` ids go
    into the segment first."""

    call: CallRecord
    segment: Segment
    prompt_ids: list[int]
    max_new: int
    settings: CallSettings
    end_hash: bytes
    """Hash of the request's messages; the reply chains onto it."""
    suffix: list[Message] = field(default_factory=list)
    delta: list[int] = field(default_factory=list)


class Renderers:
    """One ``ChatRenderer`` per tool set (by ``tools_key``), built on first use."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._by_key: dict[str, ChatRenderer] = {}

    def get(self, key: str, tools: Sequence[dict[str, Any]]) -> ChatRenderer:
        if key not in self._by_key:
            self._by_key[key] = ChatRenderer(self.tokenizer, tools)
        return self._by_key[key]


@dataclass
class AgentEpisode:
    """One key, one agent run (see the module docstring). Invariants: ``calls[i].index ==
    i``; a segment's recorded calls each extend the one before; ``tokens`` = model tokens +
    extend deltas recorded; ``end`` once set never changes."""

    id: str
    row: dict[str, Any]
    seed: int
    policy: CallPolicy
    limits: CallLimits
    key_hash: bytes = b""
    calls: list[CallRecord] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    ends: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    """hash(messages + [reply]) -> (segment, len(its ids) after the reply)."""
    tokens: int = 0
    inflight: set[asyncio.Task] = field(default_factory=set)
    end: str | None = None
    error: str = ""

    def plan(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict],
        settings: CallSettings,
        renderers: Renderers,
    ) -> Plan:
        """Match ``messages`` (see the module docstring), check the limits and claim the
        call: ``Refused`` (with the episode's end when a budget is spent) or a ``Plan``."""
        if len(self.calls) >= self.limits.max_calls:
            why = f"{self.limits.max_calls} calls made: the episode's limit"
            raise self._ends(Refused("messages", why, code="max_calls", end="max_turns"))
        key = tools_key(tools)
        hashes = prefix_hashes(messages, key)
        shaped = [template_message(m) for m in messages]
        try:  # a template may refuse a conversation (its roles, their order): the request's
            renderer = renderers.get(key, tools)
            plan = self._match(messages, hashes, shaped, renderer) or self._fresh(
                shaped, key, renderer
            )
        except Refused:
            raise
        except ValueError as e:
            raise Refused("messages", str(e), code="template_error") from e
        plan.end_hash, plan.settings = hashes[-1], settings
        plan.max_new = self._max_new(plan)
        return self._claim(plan)

    def _match(
        self,
        messages: Sequence[Message],
        hashes: list[bytes],
        shaped: list[Message],
        renderer: ChatRenderer,
    ) -> Plan | None:
        """The extend or fork of the longest answered prefix, or None."""
        for i in range(len(messages) - 1, 0, -1):
            if messages[i - 1].get("role") != "assistant" or hashes[i] not in self.ends:
                continue
            s, offset = self.ends[hashes[i]]
            seg, suffix = self.segments[s], shaped[i:]
            if offset == len(seg.traj.ids) and not seg.busy:
                delta = renderer.delta_ids(suffix, seg.traj.ids)
                prompt = seg.traj.prompt_ids + seg.traj.ids + delta
                return _plan("extend", s, seg, prompt, suffix, delta)
            before = seg.traj.ids[:offset]
            prompt = seg.traj.prompt_ids + before + renderer.delta_ids(suffix, before)
            fork = Segment(Trajectory(prompt, shaped), seg.tools_key, len(shaped), (s, offset))
            return _plan("fork", -1, fork, prompt)
        return None

    def _fresh(self, shaped: list[Message], key: str, renderer: ChatRenderer) -> Plan:
        prompt = renderer.prompt_ids(shaped)
        seg = Segment(Trajectory(prompt, shaped), key, len(shaped))
        return _plan("new" if self.calls else "first", -1, seg, prompt)

    def _max_new(self, plan: Plan) -> int:
        """``min(the call's max_tokens, budget left, context left)``; a spent budget or a
        full context refuses the call and ends the episode (``max_tokens``)."""
        budget = self.limits.budget - self.tokens - len(plan.delta)
        context = self.limits.context - len(plan.prompt_ids)
        if budget <= 0:
            why = f"the episode's budget of {self.limits.budget} tokens is spent"
            raise self._ends(Refused("max_tokens", why, code="budget_exhausted", end="max_tokens"))
        if context <= 0:
            why = f"the prompt is {len(plan.prompt_ids)} tokens; the context {self.limits.context}"
            raise self._ends(
                Refused("messages", why, code="context_length_exceeded", end="max_tokens")
            )
        return min(plan.settings.max_tokens, budget, context)

    def _claim(self, plan: Plan) -> Plan:
        """Number the call and mark its segment busy (a new one joins ``segments``)."""
        if plan.call.segment < 0:
            self.segments.append(plan.segment)
            plan.call.segment = len(self.segments) - 1
        plan.segment.busy = True
        plan.call.index, plan.call.turn = len(self.calls), plan.segment.traj.turns
        plan.call.prompt_len, plan.call.delta = len(plan.prompt_ids), len(plan.delta)
        plan.call.overrides, plan.call.t0 = dict(plan.settings.overrides), time.monotonic()
        self.calls.append(plan.call)
        return plan

    def seed_of(self, plan: Plan) -> int:
        """The call's seed: the episode's + its index (as ``run_episode``'s turns)."""
        return (self.seed + plan.call.index) % 2**31

    def record(self, plan: Plan, c: Completion, reply: Reply) -> CallRecord:
        """Append the completion to the plan's segment (after an extend's delta) and remember
        where the conversation with ``reply.message`` ends."""
        seg, call = plan.segment, plan.call
        if call.kind == "extend":
            seg.traj.add_messages(plan.suffix, plan.delta)
        seg.traj.add_model_turn(c.token_ids, c.logprobs, c.token_versions, reply.text)
        seg.busy = False
        seg.calls.append(call.index)
        self.tokens += len(plan.delta) + len(c.token_ids)
        call.finish_reason, call.text = c.finish_reason, reply.text
        call.message = canon(reply.message)
        call.tool_calls, call.malformed = reply.tool_calls, reply.malformed
        call.t1 = time.monotonic()
        self.ends[chain(plan.end_hash, reply.message)] = (call.segment, len(seg.traj.ids))
        return call

    def abandon(self, plan: Plan) -> None:
        """A call that never finished: its segment is free again, nothing recorded."""
        plan.segment.busy = False
        plan.call.finish_reason, plan.call.t1 = "abort", time.monotonic()

    def close(self, end: str) -> None:
        """End the episode (the first end stays) and cancel its calls in flight."""
        if self.end is None:
            self.end = end
        for task in list(self.inflight):
            task.cancel()

    def export(self, mode: str = "last") -> Segment | None:
        """The segment trained first (its episode's ``Sample.part`` 0): ``last`` (and
        ``all``) holds the last recorded call, ``longest`` the most model tokens (the earliest
        of equals), ``first`` the first with a call; None when no call was recorded."""
        if mode not in EXPORT_MODES:
            raise ValueError(f"export mode {mode!r}: one of {EXPORT_MODES}")
        done = [s for s in self.segments if s.calls]
        if not done:
            return None
        if mode == "first":
            return min(done, key=lambda s: s.calls[0])
        if mode == "longest":
            return max(done, key=lambda s: s.traj.model_tokens)
        return max(done, key=lambda s: s.calls[-1])

    def exported(self, mode: str = "last") -> list[Segment]:
        """Every segment trained: ``export(mode)`` first, then (``all`` only) the other
        segments with a recorded call, by their first call; [] when none was recorded."""
        first = self.export(mode)
        if first is None:
            return []
        others = [s for s in self.segments if s.calls and s is not first] if mode == "all" else []
        return [first, *sorted(others, key=lambda s: s.calls[0])]

    def _ends(self, refused: Refused) -> Refused:
        if refused.end is not None:
            self.close(refused.end)
        return refused


def _plan(kind: str, segment: int, seg: Segment, prompt: list[int], suffix=(), delta=()) -> Plan:
    """A plan whose numbers ``AgentEpisode._claim`` fills in (``segment`` -1: a new one)."""
    call = CallRecord(-1, kind, segment, -1, len(prompt), len(delta))
    no = CallSettings(0, 0.0, {})
    return Plan(call, seg, list(prompt), 0, no, b"", list(suffix), list(delta))
