"""The calculator agent of agent.py written with the OpenAI Agents SDK (``openai-agents``,
``pip install -e .[agents]``) instead of the plain ``openai`` client, trained through the
actor's endpoint the same way::

    asyncrl run experiment=smollm2_agent episode.agent=examples/smollm2_agent/agents_sdk.py:agent

The SDK owns the loop: ``Runner.run`` calls the model (``OpenAIChatCompletionsModel`` on an
``AsyncOpenAI`` client pointed at the endpoint), runs the calculator (a ``FunctionTool``) on
each tool call and calls again, until a reply without one. Tracing is off: nothing leaves the
host. Each call is ``POST /v1/chat/completions`` with ``model``, ``messages`` and ``tools``
only (no sampling field, ``tool_choice``, ``parallel_tool_calls`` or ``stream``; ``store`` is
sent to api.openai.com only), so the endpoint refuses and overrides nothing.

What the endpoint receives, against agent.py's calls:

    tools      ``{"type": "function", "function": {"name", "description", "parameters",
               "strict": false}}``: agent.py's name, description and parameters, but the SDK
               writes every function tool this way, so agent.py's ``"return": {"type":
               "string"}`` is missing and ``"strict"`` is there. SmolLM2's template ignores
               ``tools=``, so the endpoint writes the schema into the system message as JSON
               (docs/agents.md): the prompt differs from agent.py's in that one line
    examples   the worked examples' ``tool`` messages answer no call; the SDK sends a tool
               result only as a ``function_call_output`` item with a ``call_id``, and keeps
               only the last of the items sharing one, so each gets its own: the endpoint
               receives ``{"role": "tool", "tool_call_id": "example_3", "content": "888"}``
               for agent.py's ``{"role": "tool", "content": "888"}`` (SmolLM2's template
               renders a message's role and content only: the same tokens)
    replies    sent back as the SDK rebuilds them, ``{"role": "assistant", "content": None,
               "tool_calls": [...]}`` with the ids and argument strings as received: the
               endpoint matches them to its replies (each call ``extend``s the one before).
               Tool results carry ``tool_call_id`` and ``content`` (agent.py's also ``name``)
    malformed  a reply holding a ``<tool_call>`` block the endpoint could not parse is text,
               so the SDK ends its run with it as the final output; the agent answers it with
               agent.py's ``MALFORMED`` tool message and runs again on the conversation so
               far, within the same ``MAX_CALLS``

The tool's answers, the reward and its metrics (``calls``, ``tool_errors``) are agent.py's,
from its ``calculate``, ``score`` and constants (loaded from its path: examples are not a
package). Like agent.py, this imports nothing of asyncrl.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from agents import (
    Agent,
    FunctionTool,
    MaxTurnsExceeded,
    ModelBehaviorError,
    OpenAIChatCompletionsModel,
    RunConfig,
    RunHooks,
    Runner,
    ToolErrorFormatterArgs,
    set_tracing_disabled,
)
from agents.tool_context import ToolContext
from openai import AsyncOpenAI


def _load_plain():
    """examples/smollm2_agent/agent.py, by path: the calculator, its schema and the reward."""
    path = Path(__file__).resolve().parent / "agent.py"
    spec = importlib.util.spec_from_file_location("smollm2_agent_plain", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


plain = _load_plain()
set_tracing_disabled(True)  # else the SDK exports its traces to api.openai.com


@dataclass
class Episode:
    """One run's context (``Runner.run(context=...)``): the metrics the reward logs."""

    calls: int = 0
    tool_errors: int = 0


async def _calculate(ctx: ToolContext[Episode], arguments: str) -> str:
    """The tool's body, given the call's arguments as the model wrote them (a JSON string):
    agent.py's ``run_tool`` for a call of ``calculate``; an error is the model's to read."""
    try:
        return plain.calculate(**json.loads(arguments or "{}"))
    except (ValueError, TypeError) as e:  # json.JSONDecodeError is a ValueError
        ctx.context.tool_errors += 1
        return f"Error: {e}"


_SCHEMA = plain.TOOLS[0]["function"]
CALCULATOR = FunctionTool(
    name=_SCHEMA["name"],
    description=_SCHEMA["description"],
    params_json_schema=_SCHEMA["parameters"],
    on_invoke_tool=_calculate,
    strict_json_schema=False,  # agent.py's parameters as they are, not rewritten for strict mode
)
"""The calculator as the SDK's tool. Not ``@function_tool``: that derives the parameters with
pydantic (``title``s, another key order; in its default strict mode ``additionalProperties:
false``), where a ``FunctionTool`` takes agent.py's as they are."""


def _tool_error(args: ToolErrorFormatterArgs) -> str | None:
    """The answer to a call of a tool the agent does not have, agent.py's; other errors keep
    the SDK's message (the calculator's own are answered by ``_calculate``)."""
    if args.kind != "tool_not_found":
        return None
    args.run_context.context.tool_errors += 1
    return f"Error: there is no tool {args.tool_name!r}; use calculate"


class _CountCalls(RunHooks):
    """Counts the model calls of an episode (``Episode.calls``), those of a failed run too."""

    async def on_llm_start(self, context, agent, system_prompt, input_items) -> None:
        context.context.calls += 1


RUN = RunConfig(
    tracing_disabled=True,
    tool_not_found_behavior="return_error_to_model",
    tool_error_formatter=_tool_error,
)


def input_items(messages: list[dict]) -> list[dict]:
    """A chat prompt's messages as the SDK's input items: system, user and assistant
    messages as they are; a ``tool`` message (a worked example's result, answering no call)
    as a ``function_call_output`` with a ``call_id`` of its own (see the module docstring)."""
    items = []
    for k, m in enumerate(messages):
        if m["role"] == "tool":
            call_id = f"example_{k}"
            items.append(
                {"type": "function_call_output", "call_id": call_id, "output": m["content"]}
            )
        else:
            items.append({"role": m["role"], "content": m["content"]})
    return items


async def agent(row, *, base_url, api_key, model):
    """One episode, as agent.py's: the SDK's runs until a reply without a tool call, at most
    ``MAX_CALLS`` calls in all; an unparsed ``<tool_call>`` block is answered with
    ``MALFORMED`` and the conversation goes on. An episode that ends without a reply free of
    tool calls (the calls spent, or a reply cut off before any text) scores 0."""
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    calculator = Agent(
        name="calculator",  # no instructions: the system message is the row's first message
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        tools=[CALCULATOR],
    )
    ep, items, final = Episode(), input_items(row["messages"]), ""
    async with client:
        while ep.calls < plain.MAX_CALLS:
            try:
                result = await Runner.run(
                    calculator,
                    items,
                    context=ep,
                    max_turns=plain.MAX_CALLS - ep.calls,
                    hooks=_CountCalls(),
                    run_config=RUN,
                )
            except (MaxTurnsExceeded, ModelBehaviorError):  # every call a tool call; cut off
                break
            if "<tool_call>" not in result.final_output:
                final = result.final_output
                break
            ep.tool_errors += 1
            answer = {"call_id": f"malformed_{ep.calls}", "output": plain.MALFORMED}
            items = [*result.to_input_list(), {"type": "function_call_output", **answer}]
    score = plain.score(final, row["ground_truth"])
    return {"score": score, "calls": ep.calls, "tool_errors": ep.tool_errors}
