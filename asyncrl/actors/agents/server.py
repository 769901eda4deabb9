"""``AgentServer``: an OpenAI-compatible endpoint on an actor's own loop, for agents that own
their loop and call the policy as a chat model (``/v1/chat/completions``, streamed or not, and
``/v1/models``).

    POST /v1/chat/completions  Bearer key -> the episode (401 unknown / ended)
        -> CallPolicy.resolve (the run's sampling; 400 naming a refused field)
        -> AgentEpisode.plan (first / extend / fork / new; 400 when a budget is spent)
        -> CallEngine.complete (a task the episode's end cancels)
        -> the reply (tool_calls in OpenAI's format when tools were given and the text has
           calls) -> AgentEpisode.record -> 200, the body (``stream: true``: the reply as
           server-sent events, reply_format.py)

aiohttp (``web.AppRunner(app, handle_signals=False, access_log=None)`` on a ``SockSite``: it
leaves the actor's signal handlers alone) is installed only alongside vLLM, so it is imported
when the server starts, never by importing this module. The endpoint binds to loopback only:
agents run in the actor's own worker processes, and the keys are bearer tokens sent in clear.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from asyncrl.actors.agents.keys import EndedKey, Keys, UnknownKey
from asyncrl.actors.agents.messages import Refused, openai_tool_calls, read_messages
from asyncrl.actors.agents.record import AgentEpisode, Plan, Renderers, Reply
from asyncrl.actors.agents.reply_format import logprobs_content, sse_body, stream_chunks
from asyncrl.actors.engine.completions import Completion
from asyncrl.actors.episodes.tool_calls import get_parser

MAX_BODY = 64 * 2**20
"""Largest request body, bytes (a long agent conversation, not an upload)."""


@dataclass(frozen=True)
class EngineCall:
    """One completion to sample: at most ``max_tokens`` after ``prompt_ids`` [P], at
    ``temperature``, seeded ``seed``, with ``Engine.generate``'s ``options``."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    seed: int
    options: dict[str, Any]


class CallEngine(Protocol):
    """What the endpoint needs of the engine: one whole completion per call (the actor's
    wraps ``groups.generate_whole`` with n=1; tests script one). Cancelling ``complete``
    cancels the request."""

    async def complete(self, call: EngineCall) -> Completion: ...


@dataclass(frozen=True)
class ServerOptions:
    """``model``: the id ``/v1/models`` lists and replies carry; ``bind``/``port``: where it
    listens (a loopback address; port 0 = a free one); ``tool_parser``: the format of tool
    calls in the model's text (``episodes.tool_calls.PARSERS``)."""

    model: str = "policy"
    bind: str = "127.0.0.1"
    port: int = 0
    tool_parser: str = "hermes"

    def __post_init__(self) -> None:
        try:
            loopback = ipaddress.ip_address(self.bind).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ValueError(
                f"agent endpoint bind={self.bind!r}: a loopback address only (127.0.0.1, ::1): "
                "agents run beside the actor, and its per-episode keys travel in clear"
            )
        get_parser(self.tool_parser)  # unknown: a ValueError naming the known ones


@dataclass
class ServerCounts:
    """What the endpoint did: calls by kind, refusals by reason (``bad_key``, ``ended``, a
    budget's code, else the refused field: ``n``, ``stream``, ...), overrides by parameter,
    calls naming another model, calls the client retried (``x-stainless-retry-count``),
    calls answered as a stream."""

    calls: Counter = field(default_factory=Counter)
    refused: Counter = field(default_factory=Counter)
    overridden: Counter = field(default_factory=Counter)
    model_other: int = 0
    retries: int = 0
    streamed: int = 0
    """Calls answered as a stream (``stream: true``)."""


class AgentServer:
    """The endpoint (see the module docstring). ``open(episode) -> key`` before its agent
    runs, ``end(episode_id, end)`` after; ``start()`` / ``close()`` around them all."""

    def __init__(self, engine: CallEngine, tokenizer: Any, options: ServerOptions | None = None):
        self.engine, self.tokenizer = engine, tokenizer
        self.options = options or ServerOptions()
        self.renderers = Renderers(tokenizer)
        self.parse = get_parser(self.options.tool_parser)
        self.keys = Keys()
        self.episodes: dict[str, AgentEpisode] = {}
        self.counts = ServerCounts()
        self.base_url = ""
        self._runner: Any = None

    async def start(self) -> str:
        """Listen; returns the base URL (``http://127.0.0.1:PORT/v1``)."""
        from aiohttp import web

        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        family = socket.AF_INET6 if ":" in self.options.bind else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.bind((self.options.bind, self.options.port))
            await web.SockSite(self._runner, sock).start()
        except BaseException:  # the port taken, or cancelled: leave nothing listening
            sock.close()
            await self.close()
            raise
        host, port = sock.getsockname()[:2]
        self.base_url = f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"
        return self.base_url

    async def close(self) -> None:
        """End every open episode (``closed``) and stop listening."""
        for episode_id in list(self.episodes):
            self.end(episode_id, "closed")
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def open(self, episode: AgentEpisode) -> str:
        """Register ``episode`` and return its new key (for its agent only)."""
        key, episode.key_hash = self.keys.mint(episode.id)
        self.episodes[episode.id] = episode
        return key

    def end(self, episode_id: str, end: str) -> AgentEpisode:
        """End an episode: its key revoked, its calls in flight cancelled; returns it for
        export (its ``end`` is the first one set: a spent budget's, else ``end``)."""
        ep = self.episodes.pop(episode_id)
        ep.close(end)
        self.keys.revoke(ep.key_hash, ep.end or end)
        return ep

    async def _models(self, request: Any) -> Any:
        ep_or_error = self._episode(request)
        if not isinstance(ep_or_error, AgentEpisode):
            return ep_or_error
        model = {"id": self.options.model, "object": "model", "created": 0, "owned_by": "asyncrl"}
        return _json({"object": "list", "data": [model]})

    async def _chat(self, request: Any) -> Any:
        ep = self._episode(request)
        if not isinstance(ep, AgentEpisode):
            return ep
        if request.headers.get("x-stainless-retry-count", "0") not in ("", "0"):
            self.counts.retries += 1
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError as e:
            return _error(400, f"the body is not a JSON object: {e}", "invalid_json", None)
        try:
            plan = self._plan(ep, body)
        except Refused as r:
            self.counts.refused[r.param if r.code == "invalid_request" else r.code] += 1
            if ep.end is not None:
                self.keys.revoke(ep.key_hash, ep.end)
            return _error(400, str(r), r.code, r.param)
        c = await self._generate(ep, plan)
        if c is None:
            return _error(401, f"episode_ended: {ep.end}", "episode_ended", None)
        reply = self._reply(c, body, f"call_{ep.id}_{plan.call.index}")
        ep.record(plan, c, reply)
        self.counts.calls[plan.call.kind] += 1
        out = self._completion(ep, plan, c, reply, bool(body.get("logprobs")))
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self.counts.streamed += 1
            return await _stream(request, stream_chunks(out, usage))
        return _json(out)

    def _episode(self, request: Any) -> AgentEpisode | Any:
        """The episode of the request's key, or the 401 response that says why not."""
        auth = request.headers.get("Authorization", "")
        key = auth[len("Bearer ") :] if auth.startswith("Bearer ") else ""
        try:
            return self.episodes[self.keys.resolve(key)]
        except EndedKey as e:
            self.counts.refused["ended"] += 1
            return _error(401, f"episode_ended: {e}", "episode_ended", None)
        except (UnknownKey, KeyError):
            self.counts.refused["bad_key"] += 1
            return _error(
                401, "invalid_api_key: not a key of a running episode", "invalid_api_key", None
            )

    def _plan(self, ep: AgentEpisode, body: dict[str, Any]) -> Plan:
        """Settings, messages and tools of the request, planned (``Refused`` says why not)."""
        settings = ep.policy.resolve(body)
        messages = read_messages(body)
        tools = body.get("tools") or []
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise Refused("tools", "tools: a list of OpenAI function schemas")
        if body.get("model") != self.options.model:
            self.counts.model_other += 1
        plan = ep.plan(messages, tools, settings, self.renderers)
        self.counts.overridden.update(settings.overrides.keys())
        return plan

    async def _generate(self, ep: AgentEpisode, plan: Plan) -> Completion | None:
        """The completion, or None when the episode ended while it ran (it is then cancelled
        or, finished just before, dropped: abandoned, nothing recorded, so an exported
        episode never grows). Kept in ``ep.inflight`` while it runs."""
        s = plan.settings
        call = EngineCall(plan.prompt_ids, plan.max_new, s.temperature, ep.seed_of(plan), s.options)
        task = asyncio.ensure_future(self.engine.complete(call))
        ep.inflight.add(task)
        try:
            await asyncio.wait({task})
        finally:
            ep.inflight.discard(task)
            if not task.done():  # this handler was cancelled: the request goes with it
                task.cancel()
                ep.abandon(plan)
        ended = task.cancelled() or ep.end is not None
        if ended or task.exception() is not None:
            ep.abandon(plan)
        return None if ended else task.result()

    def _reply(self, c: Completion, body: dict[str, Any], ids: str) -> Reply:
        """The assistant message of ``c``: with tools (and ``tool_choice`` not ``none``) the
        text's well-formed calls as ``tool_calls`` and the text outside them as ``content``;
        a text whose every block is malformed is returned whole."""
        text = self.tokenizer.decode(c.token_ids, skip_special_tokens=True)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if not body.get("tools") or body.get("tool_choice") == "none":
            return Reply(text, message)
        parsed = self.parse(text)
        if parsed.calls:
            message["content"] = parsed.content or None
            message["tool_calls"] = openai_tool_calls(parsed.calls, ids)
        return Reply(text, message, len(parsed.calls), len(parsed.malformed))

    def _completion(
        self, ep: AgentEpisode, plan: Plan, c: Completion, reply: Reply, logprobs: bool
    ) -> dict:
        """The ``chat.completion`` body of a recorded call (with the sampled tokens'
        log-probs when asked)."""
        finish = "tool_calls" if reply.tool_calls and c.finish_reason == "stop" else c.finish_reason
        n_prompt, n_out = len(plan.prompt_ids), len(c.token_ids)
        lps = logprobs_content(self.tokenizer, c.token_ids, c.logprobs) if logprobs else None
        choice = {"index": 0, "message": reply.message, "finish_reason": finish, "logprobs": lps}
        return {
            "id": f"chatcmpl-{ep.id}-{plan.call.index}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.options.model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": n_prompt,
                "completion_tokens": n_out,
                "total_tokens": n_prompt + n_out,
            },
        }


def _json(body: dict[str, Any], status: int = 200) -> Any:
    from aiohttp import web

    return web.json_response(body, status=status)


async def _stream(request: Any, events: list[dict[str, Any]]) -> Any:
    """``events`` as a ``text/event-stream`` response (reply_format.py ``sse_body``)."""
    from aiohttp import web

    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    await response.write(sse_body(events))
    await response.write_eof()
    return response


def _error(status: int, message: str, code: str, param: str | None) -> Any:
    """An OpenAI-style error body (the client raises it as ``AuthenticationError`` for 401,
    ``BadRequestError`` for 400: neither is retried)."""
    kind = "authentication_error" if status == 401 else "invalid_request_error"
    return _json(
        {"error": {"message": message, "type": kind, "param": param, "code": code}}, status
    )
