"""One agent episode's calls as token-exact trajectories (asyncrl/actors/agents/record.py):
a call is planned as first / extend / fork / new from its messages, its prompt built from the
recorded tokens (never a re-encoded reply), its completion recorded into its segment; budgets
end the episode; one segment is exported. Demo tokenizers only: the demo's own (no end-of-turn
token), one with ``ans``/``wer``/``answer`` tokens added (a turn sampled as "ans"+"wer" that
``encode`` makes one "answer"), and one whose template ends a turn with its EOS token."""

from __future__ import annotations

import pytest

from asyncrl.actors.agents.messages import Refused
from asyncrl.actors.agents.policy import CallPolicy
from asyncrl.actors.agents.record import AgentEpisode, CallLimits, Renderers, Reply
from asyncrl.actors.engine.completions import Completion
from asyncrl.actors.episodes.render import ChatRenderer
from asyncrl.actors.episodes.trajectory import Trajectory, rerender_mismatch
from asyncrl.orchestration.demo.tokenizer import build_tokenizer

EOT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<|endoftext|>\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
QUESTION = [
    {"role": "system", "content": "you add"},
    {"role": "user", "content": "what is 1+2?"},
]
SURE = {"role": "user", "content": "sure?"}


@pytest.fixture(scope="module")
def tok():
    t = build_tokenizer()
    t.add_tokens(["ans", "wer", "answer"])  # encode("answer") is one token; "ans"+"wer" two
    return t


@pytest.fixture(scope="module")
def eot_tok():
    t = build_tokenizer()
    t.chat_template = EOT_TEMPLATE  # a turn ends with <|endoftext|> (id 1), then "\n"
    return t


LIMITS = CallLimits(max_calls=8, budget=400, context=1000)


def episode(limits: CallLimits = LIMITS, seed: int = 100) -> AgentEpisode:
    return AgentEpisode("e0", {}, seed, CallPolicy(16, 1.0), limits)


def turn(tok, text: str, version: int = 0, end: bool = False, finish: str = "stop") -> Completion:
    """A completion of ``text``'s tokens (and the EOS token when ``end``)."""
    ids = tok.encode(text, add_special_tokens=False) + ([tok.eos_token_id] if end else [])
    return Completion(ids, [-0.5] * len(ids), [version] * len(ids), finish)


def call(ep, renderers, messages, c: Completion, tools=()):
    """Plan, 'sample' ``c`` and record it as the server does; returns (plan, reply message)."""
    plan = ep.plan(messages, tools, ep.policy.resolve({}), renderers)
    text = renderers.tokenizer.decode(c.token_ids, skip_special_tokens=True)
    reply = Reply(text, {"role": "assistant", "content": text})
    ep.record(plan, c, reply)
    return plan, reply.message


def check_invariants(traj: Trajectory) -> None:
    n = len(traj.ids)
    assert len(traj.mask) == len(traj.logprobs) == len(traj.versions) == n
    assert traj.mask[0] == 1 and traj.awaits_messages
    assert all(p == 0.0 for p, m in zip(traj.logprobs, traj.mask, strict=True) if m == 0)


def test_the_first_call_is_the_rendered_prompt_and_its_tokens_as_sampled(tok):
    ep, rs = episode(), Renderers(tok)
    c = turn(tok, "3", end=True)
    plan, _ = call(ep, rs, QUESTION, c)
    r = ChatRenderer(tok)
    assert plan.call.kind == "first" and plan.prompt_ids == r.prompt_ids(QUESTION)
    seg = ep.segments[0]
    assert seg.traj.ids == c.token_ids and seg.traj.mask == [1, 1]
    assert (ep.tokens, seg.calls, seg.opening, ep.seed_of(plan)) == (2, [0], 2, 100)
    check_invariants(seg.traj)


def test_an_extend_keeps_the_sampled_split_and_never_re_encodes_the_reply(tok):
    """The reply "the answer" was sampled as "ans"+"wer"; sent back, it is extended from the
    sampled tokens, not from ``encode`` (one "answer" token): a re-render differs by 2."""
    ep, rs = episode(), Renderers(tok)
    pieces = [*tok.encode("the ", add_special_tokens=False), *tok.encode("ans"), *tok.encode("wer")]
    first = Completion(pieces, [-0.1] * len(pieces), [0] * len(pieces), "stop")
    _, reply = call(ep, rs, QUESTION, first)
    assert reply["content"] == "the answer"
    assert tok.encode("the answer", add_special_tokens=False) != pieces
    messages = [*QUESTION, reply, SURE]
    plan, _ = call(ep, rs, messages, turn(tok, "yes", version=1))
    r = ChatRenderer(tok)
    delta = r.delta_ids([SURE], pieces)
    assert plan.call.kind == "extend" and plan.delta == delta
    assert plan.prompt_ids == r.prompt_ids(QUESTION) + pieces + delta
    traj = ep.segments[0].traj
    assert len(ep.segments) == 1 and traj.mask == [1] * len(pieces) + [0] * len(delta) + [1] * 3
    assert ep.tokens == len(pieces) + len(delta) + 3
    assert rerender_mismatch(traj, r) == 2
    check_invariants(traj)


def test_an_unclosed_turn_gets_the_end_of_turn_token_in_its_delta(eot_tok):
    ep, rs = episode(), Renderers(eot_tok)
    r = ChatRenderer(eot_tok)
    _, reply = call(ep, rs, QUESTION, turn(eot_tok, "3", finish="length"))  # cut: no EOS
    plan, reply2 = call(ep, rs, [*QUESTION, reply, SURE], turn(eot_tok, "yes", end=True))
    assert plan.delta[0] == r.end_of_turn == eot_tok.eos_token_id
    plan, _ = call(ep, rs, [*QUESTION, reply, SURE, reply2, SURE], turn(eot_tok, "ok", end=True))
    assert plan.call.kind == "extend" and plan.delta[0] != r.end_of_turn  # sampled its own
    check_invariants(ep.segments[0].traj)


def test_a_branch_from_an_interior_call_forks_with_the_earlier_tokens_as_its_prompt(tok):
    ep, rs = episode(), Renderers(tok)
    c1 = turn(tok, "3")
    _, r1 = call(ep, rs, QUESTION, c1)
    _, r2 = call(ep, rs, [*QUESTION, r1, SURE], turn(tok, "yes"))
    other = {"role": "user", "content": "and 2+2?"}
    plan, _ = call(ep, rs, [*QUESTION, r1, other], turn(tok, "4"))
    r = ChatRenderer(tok)
    assert plan.call.kind == "fork" and len(ep.segments) == 2
    fork = ep.segments[1]
    assert fork.forked_from == (0, len(c1.token_ids))
    assert plan.prompt_ids == r.prompt_ids(QUESTION) + c1.token_ids + r.delta_ids([other], [])
    assert fork.traj.prompt_ids == plan.prompt_ids and fork.traj.ids == turn(tok, "4").token_ids
    # the first segment is untouched, and still extendable from its end
    plan, _ = call(ep, rs, [*QUESTION, r1, SURE, r2, SURE], turn(tok, "ok"))
    assert (plan.call.kind, plan.call.segment, ep.segments[0].calls) == ("extend", 0, [0, 1, 3])


def test_an_edited_reply_is_a_new_segment_rendered_as_sent(tok):
    ep, rs = episode(), Renderers(tok)
    _, reply = call(ep, rs, QUESTION, turn(tok, "3"))
    edited = {"role": "assistant", "content": "three"}
    plan, _ = call(ep, rs, [*QUESTION, edited, SURE], turn(tok, "yes"))
    assert plan.call.kind == "new" and plan.call.segment == 1
    assert plan.prompt_ids == ChatRenderer(tok).prompt_ids([*QUESTION, edited, SURE])
    # a reply sent back with other whitespace and model_dump's extras still extends
    sent = {**reply, "content": " 3\n", "refusal": None, "tool_calls": None}
    plan, _ = call(ep, rs, [*QUESTION, sent, SURE], turn(tok, "ok"))
    assert plan.call.kind == "extend" and plan.call.segment == 0


def test_two_concurrent_calls_on_one_end_are_an_extend_and_a_fork(tok):
    ep, rs = episode(), Renderers(tok)
    _, reply = call(ep, rs, QUESTION, turn(tok, "3"))
    messages = [*QUESTION, reply, SURE]
    a = ep.plan(messages, (), ep.policy.resolve({}), rs)
    b = ep.plan(messages, (), ep.policy.resolve({}), rs)  # before a is recorded
    assert (a.call.kind, b.call.kind) == ("extend", "fork")
    assert a.prompt_ids == b.prompt_ids  # the same tokens, in two segments
    assert ep.seed_of(b) == ep.seed_of(a) + 1
    for plan, text in ((b, "no"), (a, "yes")):
        c = turn(tok, text)
        ep.record(plan, c, Reply(text, {"role": "assistant", "content": text}))
    assert [s.calls for s in ep.segments] == [[0, 1], [2]]
    assert not any(s.busy for s in ep.segments)


def test_an_abandoned_call_frees_its_segment_and_records_nothing(tok):
    ep, rs = episode(), Renderers(tok)
    _, reply = call(ep, rs, QUESTION, turn(tok, "3"))
    messages = [*QUESTION, reply, SURE]
    plan = ep.plan(messages, (), ep.policy.resolve({}), rs)
    ep.abandon(plan)
    assert plan.call.finish_reason == "abort" and ep.segments[0].traj.turns == 1
    plan, _ = call(ep, rs, messages, turn(tok, "yes"))
    assert plan.call.kind == "extend" and plan.call.index == 2


def test_each_call_keeps_the_versions_that_sampled_it(tok):
    ep, rs = episode(), Renderers(tok)
    _, reply = call(ep, rs, QUESTION, turn(tok, "3", version=3))
    plan, _ = call(ep, rs, [*QUESTION, reply, SURE], turn(tok, "yes", version=4))
    n_delta = len(plan.delta)
    assert ep.segments[0].traj.versions == [3] + [3] * n_delta + [4, 4, 4]


def test_the_call_limit_refuses_and_ends_the_episode(tok):
    ep, rs = episode(CallLimits(1, 400, 1000)), Renderers(tok)
    _, reply = call(ep, rs, QUESTION, turn(tok, "3"))
    with pytest.raises(Refused) as e:
        call(ep, rs, [*QUESTION, reply, SURE], turn(tok, "yes"))
    assert (e.value.code, e.value.end, ep.end) == ("max_calls", "max_turns", "max_turns")
    assert len(ep.calls) == 1


def test_the_token_budget_caps_a_call_then_refuses_and_ends_the_episode(tok):
    ep, rs = episode(CallLimits(8, 30, 1000)), Renderers(tok)
    c1 = turn(tok, "123")
    _, reply = call(ep, rs, QUESTION, c1)
    plan = ep.plan(
        [*QUESTION, reply, {"role": "user", "content": "x"}], (), ep.policy.resolve({}), rs
    )
    assert plan.max_new == 30 - 3 - len(plan.delta) < 16  # the budget left after the delta
    ep.abandon(plan)
    ep.tokens = 30
    with pytest.raises(Refused) as e:
        call(ep, rs, QUESTION, turn(tok, "3"))
    assert (e.value.code, e.value.param, ep.end) == ("budget_exhausted", "max_tokens", "max_tokens")


def test_a_prompt_over_the_context_is_refused(tok):
    prompt = len(ChatRenderer(tok).prompt_ids(QUESTION))
    ep, rs = episode(CallLimits(8, 400, prompt + 5)), Renderers(tok)
    plan = ep.plan(QUESTION, (), ep.policy.resolve({"max_tokens": 16}), rs)
    assert plan.max_new == 5
    ep2 = episode(CallLimits(8, 400, prompt))
    with pytest.raises(Refused) as e:
        ep2.plan(QUESTION, (), ep2.policy.resolve({}), rs)
    assert (e.value.code, ep2.end) == ("context_length_exceeded", "max_tokens")


def test_export_picks_the_last_longest_or_first_segment_or_all(tok):
    ep, rs = episode(), Renderers(tok)
    assert ep.export("last") is None
    _, reply = call(ep, rs, QUESTION, turn(tok, "3333"))  # segment 0: 4 model tokens
    call(ep, rs, [{"role": "user", "content": "other"}], turn(tok, "12"))  # segment 1: 2
    plan = ep.plan([{"role": "user", "content": "third"}], (), ep.policy.resolve({}), rs)
    ep.abandon(plan)  # segment 2: never recorded, never exported
    assert ep.export("last") is ep.segments[1]
    assert ep.export("longest") is ep.export("first") is ep.segments[0]
    assert ep.export("all") is ep.segments[1]  # all: the last one first, then the others
    assert ep.exported("all") == [ep.segments[1], ep.segments[0]]
    assert ep.exported("longest") == [ep.segments[0]] and episode().exported("all") == []
    with pytest.raises(ValueError, match="export mode 'best'"):
        ep.export("best")


def test_another_tool_set_does_not_match(tok):
    ep, rs = episode(), Renderers(tok)
    _, reply = call(ep, rs, QUESTION, turn(tok, "3"))
    tool = {"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}
    plan, _ = call(ep, rs, [*QUESTION, reply, SURE], turn(tok, "yes"), tools=[tool])
    assert plan.call.kind == "new"


def test_a_conversation_the_template_refuses_is_a_refused_call(tok):
    """The demo template renders any roles; a template that raises on one is the request's
    fault (400 naming ``messages``), not the endpoint's."""
    t = build_tokenizer()
    t.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}"
        "{% endif %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    ep = episode()
    with pytest.raises(Refused) as e:
        ep.plan([{"role": "tool", "content": "3"}], (), ep.policy.resolve({}), Renderers(t))
    assert (e.value.code, e.value.param, ep.calls, ep.end) == (
        "template_error",
        "messages",
        [],
        None,
    )
