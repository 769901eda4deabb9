"""An agent written with the plain ``openai`` client, trained through the actor's endpoint
(``episode.agent``): the calculator task of examples/smollm2_tools, with the agent owning the
loop instead of asyncrl's tool runner::

    asyncrl run experiment=smollm2_agent     # episode.agent=examples/smollm2_agent/agent.py:agent

One episode (``agent``), as anyone would write it against an OpenAI-compatible server:

    call 1   the record's chat messages (instruction, two worked examples, the question) with
             the calculator's schema in ``tools=``; SmolLM2 answers with a tool call
    tool     the agent runs ``calculate`` itself and appends a ``tool`` message
    call 2   the conversation so far, the reply sent back as received; SmolLM2 answers
             "The answer is N."                           -> reward 1 if N is the ground truth

At most ``MAX_CALLS`` calls (the experiment's ``episode.max_turns``). The agent imports
nothing of asyncrl: the calculator is examples/smollm2_tools/tools.py's (loaded from its path,
as examples are not a package) and its schema is what ``transformers.utils.get_json_schema``
writes, as asyncrl's tool runner writes it, so the prompts match the smollm2_tools example
token for token and the two runs can be compared (docs/results.md).

The reward is computed here: the last number of the final reply against the record's
``ground_truth`` (integers in this data), plus two logged metrics, ``calls`` and
``tool_errors`` (``reward/calls``, ``reward/tool_errors`` in the run's metrics).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import openai
from transformers.utils import get_json_schema

MAX_CALLS = 3
"""Most model calls of one episode: call, answer, one more for a retry."""
MALFORMED = (
    'Error: the tool call is not valid; write <tool_call>{"name": "calculate", "arguments": '
    '{"expression": "..."}}</tool_call>'
)
"""The tool message answering a ``<tool_call>`` block the endpoint could not parse (it stays
in the reply's ``content``, ``tool_calls`` empty), as asyncrl's tool runner answers one."""
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _load_calculate():
    """``calculate`` from examples/smollm2_tools/tools.py, by path."""
    path = Path(__file__).resolve().parent.parent / "smollm2_tools" / "tools.py"
    spec = importlib.util.spec_from_file_location("smollm2_tools_calculator", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.calculate


calculate = _load_calculate()
TOOLS = [get_json_schema(calculate)]
"""The tool schemas sent with every call (OpenAI's ``{"type": "function", ...}`` format)."""


def run_tool(call) -> tuple[str, bool]:
    """The tool message's content for one of the reply's ``tool_calls``, and whether it failed
    (an unknown tool, arguments that are not JSON, or ``calculate`` refusing the expression:
    the model reads the error, as with asyncrl's own tool runner)."""
    if call.function.name != "calculate":
        return f"Error: there is no tool {call.function.name!r}; use calculate", True
    try:
        args = json.loads(call.function.arguments or "{}")
        return calculate(**args), False
    except (ValueError, TypeError) as e:  # json.JSONDecodeError is a ValueError
        return f"Error: {e}", True


def score(text: str | None, ground_truth: str) -> float:
    """1.0 when the last number in ``text`` equals ``ground_truth``, else 0.0."""
    numbers = _NUMBER.findall(text or "")
    return float(bool(numbers) and float(numbers[-1]) == float(ground_truth))


async def agent(row, *, base_url, api_key, model):
    """One episode: call the model, run its tool calls, until it answers without one (a reply
    still holding a ``<tool_call>`` block it could not parse is answered with ``MALFORMED``;
    an episode that ends without a reply free of tool calls scores 0)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = list(row["messages"])
    calls = tool_errors = 0
    final = ""  # the reply without a tool call, if one came
    async with client:
        while calls < MAX_CALLS:
            r = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
            calls += 1
            reply = r.choices[0].message
            messages.append(reply)  # sent back as received: the endpoint reuses its tokens
            if not reply.tool_calls and "<tool_call>" not in (reply.content or ""):
                final = reply.content or ""
                break
            if not reply.tool_calls:  # a call the endpoint could not parse: say so, go on
                tool_errors += 1
                messages.append({"role": "tool", "content": MALFORMED})
            for call in reply.tool_calls or []:
                content, failed = run_tool(call)
                tool_errors += failed
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "name": call.function.name, "content": content})  # fmt: skip
    return {"score": score(final, row["ground_truth"]), "calls": calls, "tool_errors": tool_errors}
