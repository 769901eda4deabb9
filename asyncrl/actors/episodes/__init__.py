"""Multi-turn episodes: what a model's turn asks of its tools, and the tools that answer.

    tool_calls  the tool calls in a model's text (``hermes``: Qwen's ``<tool_call>`` JSON),
                each malformed one named, never silently dropped
    tools       plain Python functions as tools: their schema from signature and docstring,
                a call's answer (or its error, returned to the model and counted)

The environment interface and the episode loop build on these (not yet in this folder).
"""
