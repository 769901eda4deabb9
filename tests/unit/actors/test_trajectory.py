"""Token-exact trajectories (asyncrl/actors/episodes/trajectory.py, render.py): the model's
tokens kept as sampled, the template's tokens for environment and tool messages appended by
delta rendering, and a count of where a full re-render would differ. Tokenizers only: SmolLM2's
real one (``smollm2_dir``), the demo tokenizer, and templates written here (a Qwen3-like one
that is not prefix-stable, one that renders tools, one whose turn end is unstable)."""

from __future__ import annotations

import pytest

from asyncrl.actors.episodes.render import ChatRenderer
from asyncrl.actors.episodes.tools import ToolBox
from asyncrl.actors.episodes.trajectory import Trajectory, rerender_mismatch


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: The expression, for example 17 + 25.
    """
    return str(eval(expression))  # a test tool; never called here


SCHEMAS = ToolBox([calculate]).schemas()
CALL = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "17 + 25"}}\n</tool_call>'
QUESTION = [
    {"role": "system", "content": "You solve arithmetic."},
    {"role": "user", "content": "What is 17 + 25?"},
]

# Qwen3's template, reduced to what makes it not prefix-stable: the reasoning of an assistant
# turn before the last user query is dropped, and an assistant turn after it that is the last
# message (or has reasoning) is written with a <think> block, an empty one if it has none.
QWEN3_LIKE = """
{%- set ns = namespace(last_query=-1) -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_query = loop.index0 -%}
{%- endif -%}{%- endfor -%}
{%- for m in messages -%}
{%- set content = m.content -%}
{%- if m.role == 'assistant' -%}
  {%- set reasoning = '' -%}
  {%- if '</think>' in content -%}
    {%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') -%}
    {%- set content = content.split('</think>')[-1].lstrip('\\n') -%}
  {%- endif -%}
  {%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}
    {%- set content = '<think>\\n' + reasoning + '\\n</think>\\n\\n' + content -%}
  {%- endif -%}
{%- endif -%}
{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""


@pytest.fixture(scope="module")
def smol(smollm2_dir):
    """SmolLM2-135M-Instruct's tokenizer (plain ChatML template, ``<|im_end|>`` = 2)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def sampled(tok, *pieces: str, end: bool = True) -> list[int]:
    """A model turn as vLLM returns it: each piece's tokens, then the end-of-turn token."""
    ids = [t for p in pieces for t in encode(tok, p)]
    return ids + [tok.eos_token_id] if end else ids


def add_turn(traj: Trajectory, ids: list[int], version: int | list[int], text: str) -> None:
    versions = version if isinstance(version, list) else [version] * len(ids)
    logprobs = [-0.01 * (i + 1) for i in range(len(ids))]
    traj.add_model_turn(ids, logprobs, versions, text)


def begin(r: ChatRenderer, messages: list[dict]) -> Trajectory:
    return Trajectory(r.prompt_ids(messages), messages)


def answer(traj: Trajectory, r: ChatRenderer, messages: list[dict], closed=None) -> list[int]:
    """The runner's step: the template's ids for ``messages`` after the trajectory, added."""
    ids = r.delta_ids(messages, traj.ids, closed=closed)
    traj.add_messages(messages, ids)
    return ids


def model_positions(traj: Trajectory) -> list[int]:
    return [i for i, m in enumerate(traj.mask) if m == 1]


# --- SmolLM2's real template ------------------------------------------------------------


def test_smollm2_ignores_tools_so_they_land_in_the_system_message(smol):
    r = ChatRenderer(smol, SCHEMAS)
    assert not r.tools_in_template  # plain ChatML: the same text with or without tools=
    assert r.end_of_turn == smol.convert_tokens_to_ids("<|im_end|>") == 2
    text = smol.decode(r.prompt_ids(QUESTION))
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou solve arithmetic.\n\n# Tools\n")
    assert '<tools>\n{"type": "function", "function": {"name": "calculate"' in system
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}' in system
    # with no system message of its own, the tools get one (SmolLM2's default one is replaced)
    alone = smol.decode(r.prompt_ids(QUESTION[1:]))
    assert alone.startswith("<|im_start|>system\n# Tools\n") and "SmolLM" not in alone
    assert ChatRenderer(smol).tools_in_template  # no tools: nothing to place


def test_smollm2_three_turns_keep_the_sampled_tokens_and_add_the_templates(smol):
    """Turn 2 samples " ans" "wer" where ``encode`` makes one " answer" token: the trajectory
    keeps both, and is the template's full render everywhere else."""
    assert encode(smol, " answer") == [2988]
    assert encode(smol, " ans") + encode(smol, "wer") == [31483, 5830]
    r = ChatRenderer(smol, SCHEMAS)
    traj = begin(r, QUESTION)
    assert traj.prompt_ids == r.render_ids(QUESTION, add_generation_prompt=True)

    t1 = sampled(smol, CALL)
    add_turn(traj, t1, 3, CALL)
    tool = [{"role": "tool", "content": "42"}]
    added = answer(traj, r, tool)
    assert smol.decode(added) == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    t2 = sampled(smol, "The", " ans", "wer", " is 42.")  # a weight update lands after 2 tokens
    add_turn(traj, t2, [3, 3] + [4] * (len(t2) - 2), "The answer is 42.")
    user = [{"role": "user", "content": "Are you sure?"}]
    answer(traj, r, user)
    t3 = sampled(smol, "Yes.")
    add_turn(traj, t3, 5, "Yes.")

    # the model's tokens, exactly as sampled, at the turns' places
    assert traj.turns == 3 and traj.model_tokens == len(t1) + len(t2) + len(t3)
    for start, turn in zip(traj.turn_starts, (t1, t2, t3), strict=True):
        assert traj.ids[start : start + len(turn)] == turn
    # everything else is the template's: the full render with turn 2 re-encoded, closed by "\n"
    conversation = [*QUESTION, {"role": "assistant", "content": CALL}, *tool]
    conversation += [{"role": "assistant", "content": "The answer is 42."}, *user]
    conversation += [{"role": "assistant", "content": "Yes."}]
    assert traj.messages == conversation
    full = r.render_ids(conversation, add_generation_prompt=False)
    s2 = len(traj.prompt_ids) + traj.turn_starts[1]
    ours = traj.prompt_ids + traj.ids
    reencoded = ours[:s2] + sampled(smol, "The answer is 42.") + ours[s2 + len(t2) :]
    assert reencoded + encode(smol, "\n") == full
    assert ours != full[: len(ours)]  # the sampled split is kept, not the re-encoding
    assert rerender_mismatch(traj, r) == 2  # " ans" "wer" against " answer"

    # mask, log-probs and versions
    model = model_positions(traj)
    assert model == [
        s + i for s, t in zip(traj.turn_starts, (t1, t2, t3), strict=True) for i in range(len(t))
    ]
    assert traj.mask[0] == 1 and len(traj.mask) == len(traj.ids) == len(traj.logprobs)
    assert all(traj.logprobs[i] == 0.0 for i in range(len(traj.ids)) if i not in model)
    assert all(traj.logprobs[i] < 0.0 for i in model)
    s1_end = traj.turn_starts[0] + len(t1)
    assert traj.versions[: traj.turn_starts[1]] == [3] * traj.turn_starts[1]  # tool tokens: 3
    assert traj.versions[traj.turn_starts[1] : traj.turn_starts[2]] == [3, 3] + [4] * (
        traj.turn_starts[2] - traj.turn_starts[1] - 2
    )  # the user's tokens copy the last model token's version, 4
    assert traj.versions[traj.turn_starts[2] :] == [5] * len(t3)
    assert traj.mask[s1_end : traj.turn_starts[1]] == [0] * len(added)

    fields = traj.sample_fields()
    assert fields["completion_ids"] == traj.ids and fields["loss_mask"] == traj.mask
    assert (
        fields["behavior_logprobs"] == traj.logprobs and fields["token_versions"] == traj.versions
    )
    assert fields["prompt_ids"] == traj.prompt_ids and fields["turns"] == 3


def test_a_turn_cut_before_its_end_of_turn_token_gets_the_templates(smol):
    """A stop string (or the caller's ``closed=False``) leaves ``<|im_end|>`` unsampled: the
    delta starts with it; a sampled one is never written twice."""
    r = ChatRenderer(smol, SCHEMAS)
    tool = [{"role": "tool", "content": "42"}]
    closed = r.delta_ids(tool, sampled(smol, CALL))
    assert closed == r.delta_ids(tool, [], closed=True)
    assert r.delta_ids(tool, sampled(smol, CALL, end=False)) == [r.end_of_turn, *closed]

    traj = begin(r, QUESTION)
    add_turn(traj, sampled(smol, CALL, end=False), 0, CALL)  # stopped at "</tool_call>"
    assert answer(traj, r, tool) == [r.end_of_turn, *closed]
    add_turn(traj, sampled(smol, "42"), 0, "42")
    assert rerender_mismatch(traj, r) == 0

    explicit = begin(r, QUESTION)
    add_turn(explicit, sampled(smol, CALL), 0, CALL)
    assert answer(explicit, r, tool, closed=False) == [r.end_of_turn, *closed]


def test_a_trajectory_that_the_template_reproduces_counts_no_mismatch(smol):
    r = ChatRenderer(smol, SCHEMAS)
    traj = begin(r, QUESTION)
    add_turn(traj, sampled(smol, CALL), 0, CALL)
    answer(traj, r, [{"role": "tool", "content": "42"}])
    assert rerender_mismatch(traj, r) == 0  # ends with messages: compared with the gen. prompt
    add_turn(traj, sampled(smol, "The answer is 42."), 1, "The answer is 42.")
    assert rerender_mismatch(traj, r) == 0  # ends with a turn: compared as the template closes it


# --- a template that is not prefix-stable -----------------------------------------------


def test_a_qwen3_like_template_keeps_the_sampled_think_and_counts_the_rerender(smol):
    """The template drops earlier ``<think>`` blocks and writes an empty one into the last
    assistant turn: the base conversation's stub renders differently once messages follow, yet
    the delta (what follows the stub's content) is stable, and the trajectory is sampled +
    template tokens, while a re-render loses the reasoning of turns 1 and 2."""
    r = ChatRenderer(smol, chat_template=QWEN3_LIKE)
    stub = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]
    assert "<think>" in r.render_text(stub, False)  # the last turn gets an empty think block
    assert "<think>" not in r.render_text([*stub, {"role": "tool", "content": "1"}], True)

    question = [{"role": "user", "content": "What is 17 + 25?"}]
    traj = begin(r, question)
    assert smol.decode(traj.prompt_ids) == (
        "<|im_start|>user\nWhat is 17 + 25?<|im_end|>\n<|im_start|>assistant\n"
    )
    think1 = "<think>\nI need the calculator.\n</think>\n\n"
    t1 = sampled(smol, think1 + CALL)
    add_turn(traj, t1, 0, think1 + CALL)
    a1 = answer(traj, r, [{"role": "tool", "content": "42"}])
    think2 = "<think>\nThe tool says 42.\n</think>\n\n"
    t2 = sampled(smol, think2 + "It is 42.")
    add_turn(traj, t2, 1, think2 + "It is 42.")
    a2 = answer(traj, r, [{"role": "user", "content": "Are you sure?"}])
    t3 = sampled(smol, "<think>\nYes.\n</think>\n\nYes.")
    add_turn(traj, t3, 1, "<think>\nYes.\n</think>\n\nYes.")

    # exactly what was sampled plus what the template adds after each turn, written out here
    assert a1 == encode(smol, "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n")
    assert a2 == encode(
        smol, "\n<|im_start|>user\nAre you sure?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert traj.ids == t1 + a1 + t2 + a2 + t3
    assert model_positions(traj) == [
        *range(len(t1)),
        *range(len(t1 + a1), len(t1 + a1 + t2)),
        *range(len(t1 + a1 + t2 + a2), len(traj.ids)),
    ]

    # a re-render drops both earlier think blocks and nothing else: the count is the tokens
    # it lost (about the blocks' own tokens; where the cut falls shifts a boundary token)
    rerendered = r.render_ids(traj.messages, add_generation_prompt=False)
    text = smol.decode(rerendered)
    assert "calculator." not in text and "The tool says" not in text and "Yes.\n</think>" in text
    lost = len(traj.prompt_ids + traj.ids + r.end_ids()) - len(rerendered)
    dropped = len(encode(smol, think1)) + len(encode(smol, think2))
    assert rerender_mismatch(traj, r) == lost and abs(lost - dropped) <= 2


def _trl_template(name: str) -> str:
    """A model's real chat template as TRL ships it (``trl/chat_templates/<name>.jinja``)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("trl")  # finds the package without importing it
    if spec is None or spec.origin is None:
        pytest.skip("needs trl (pip install -e .[bench]), which ships Qwen's real chat templates")
    return (Path(spec.origin).parent / "chat_templates" / f"{name}.jinja").read_text()


@pytest.mark.parametrize(("name", "stable"), [("qwen2_5", True), ("qwen3", False)])
def test_qwens_real_templates_render_tools_and_answers_token_for_token(smol, name, stable):
    """Qwen 2.5's and Qwen3's own templates (on SmolLM2's tokenizer, which has their ChatML
    specials): the tools go through ``tools=``, a tool's answer is a ``<tool_response>`` in a
    user turn, and the trajectory is sampled + template tokens; a re-render reproduces it under
    Qwen 2.5 and drops the earlier reasoning under Qwen3."""
    r = ChatRenderer(smol, SCHEMAS, chat_template=_trl_template(name))
    assert r.tools_in_template and r.end_of_turn == 2
    question = [{"role": "user", "content": "What is 17 + 25?"}]
    traj = begin(r, question)
    assert '{"name": "calculate"' in smol.decode(traj.prompt_ids)
    think = "<think>\nI need the calculator.\n</think>\n\n"
    t1 = sampled(smol, think + CALL)
    add_turn(traj, t1, 0, think + CALL)
    a1 = answer(traj, r, [{"role": "tool", "content": "42"}])
    assert smol.decode(a1) == (
        "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    t2 = sampled(smol, "It is 42.")
    add_turn(traj, t2, 1, "It is 42.")
    a2 = answer(traj, r, [{"role": "user", "content": "Are you sure?"}])
    t3 = sampled(smol, "Yes.")
    add_turn(traj, t3, 1, "Yes.")
    assert traj.ids == t1 + a1 + t2 + a2 + t3
    lost = rerender_mismatch(traj, r)
    assert lost == 0 if stable else abs(lost - len(encode(smol, think))) <= 2


def test_a_template_whose_turn_end_changes_with_what_follows_is_refused(smol):
    """Writes ``<|im_end|>`` only after the last message: the tokens after a sampled turn
    would depend on the next messages, so no delta is stable."""
    unstable = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "{% if loop.last %}<|im_end|>{% endif %}\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(ValueError, match="not prefix-stable after an assistant turn"):
        ChatRenderer(smol, chat_template=unstable)


# --- tools through a template that renders them; the demo tokenizer ----------------------


def test_a_template_that_renders_tools_gets_them_and_the_messages_stay_as_they_are(smol):
    with_tools = (
        "{% if tools %}<|im_start|>system\ntools:{% for t in tools %} {{ t.function.name }}"
        "{% endfor %}<|im_end|>\n{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    r = ChatRenderer(smol, SCHEMAS, chat_template=with_tools)
    assert r.tools_in_template
    text = smol.decode(r.prompt_ids(QUESTION))
    assert text.startswith("<|im_start|>system\ntools: calculate<|im_end|>\n")
    assert "# Tools" not in text and "You solve arithmetic.<|im_end|>" in text


def test_the_demo_tokenizers_template_works_without_an_end_of_turn_token():
    """``"<role>: <content>\\n"`` per message: nothing special after a turn, so the sampled
    EOS (id 1, which the template never writes) stays and the delta starts with ``"\\n"``."""
    from asyncrl.orchestration.demo.tokenizer import build_tokenizer

    tok = build_tokenizer()
    r = ChatRenderer(tok)
    assert r.end_of_turn is None and r.tools_in_template
    traj = begin(r, [{"role": "user", "content": "2+3=?"}])
    assert tok.decode(traj.prompt_ids) == "user: 2+3=?\nassistant: "
    t1 = sampled(tok, "calc 2+3")
    add_turn(traj, t1, 7, "calc 2+3")
    a1 = answer(traj, r, [{"role": "tool", "content": "5"}])
    assert tok.decode(a1) == "\ntool: 5\nassistant: "
    t2 = sampled(tok, "5")
    add_turn(traj, t2, 8, "5")
    assert traj.ids == t1 + a1 + t2 and t1[-1] == t2[-1] == tok.eos_token_id == 1
    assert traj.versions == [7] * len(t1 + a1) + [8] * len(t2)
    assert rerender_mismatch(traj, r) == 2  # the two sampled EOS the template does not write

    # the demo template ignores tools too: they go to the system message (text outside the
    # demo alphabet, e.g. capitals, is dropped on encode; a demo task gives its own section)
    short = ChatRenderer(tok, SCHEMAS, tools_section=lambda ts: "tools: calculate(expression)")
    assert not short.tools_in_template
    assert tok.decode(short.prompt_ids([{"role": "user", "content": "hi"}])) == (
        "system: tools: calculate(expression)\nuser: hi\nassistant: "
    )


# --- misuse is refused ------------------------------------------------------------------


def test_turns_and_messages_must_alternate_and_agree_in_length():
    from asyncrl.orchestration.demo.tokenizer import build_tokenizer

    r = ChatRenderer(build_tokenizer())
    traj = begin(r, [{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="episode without a model turn"):
        traj.sample_fields()
    with pytest.raises(ValueError, match="messages follow a model turn"):
        answer(traj, r, [{"role": "user", "content": "again"}])
    with pytest.raises(ValueError, match="at least one token"):
        traj.add_model_turn([], [], [], "")
    with pytest.raises(ValueError, match="needs as many logprobs and versions"):
        traj.add_model_turn([5, 6], [-0.1], [0, 0], "ab")
    traj.add_model_turn([5, 6], [-0.1, -0.2], [0, 0], "ab")
    with pytest.raises(ValueError, match="two model turns in a row"):
        traj.add_model_turn([5], [-0.1], [0], "a")
    answer(traj, r, [{"role": "user", "content": "more"}])
    with pytest.raises(ValueError, match="messages follow a model turn"):
        answer(traj, r, [{"role": "user", "content": "again"}])


def test_a_tokenizer_without_a_chat_template_is_refused():
    from asyncrl.orchestration.demo.tokenizer import build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        ChatRenderer(tok)
