"""Multi-turn episodes: the model's turns against an environment and tools, token for token
(docs/environments.md).

    tool_calls  the tool calls in a model's text (``hermes``: Qwen's ``<tool_call>`` JSON),
                each malformed one named, never silently dropped
    tools       plain Python functions as tools: their schema from signature and docstring,
                a call's answer (or its error, returned to the model and counted)
    render      the chat template as token ids: the first prompt, and the tokens it adds after
                a model turn for the next messages (delta rendering, never the whole
                conversation again); tools in the system message when the template drops them
    trajectory  one episode token for token: the model's tokens as sampled (mask 1), the
                template's for environment and tool messages (mask 0), per-token versions
    env         the environment a user writes (reset/step, optional tools/close), loaded by
                spec; the checks of what it returns; ``ToolsOnly`` for tasks with tools only
    env_pool    environments out of the actor's loop: episodes pinned to worker processes,
                every call with a deadline; EnvTimeout / EnvError / EnvCrashed, counted
    env_process one worker process seen from the actor (JSON lines, reader/writer threads)
    env_worker  the worker process: many episodes on one asyncio loop, sync code in threads
    worker_loop the serving loop of a worker process (this one and the agent worker): JSON
                lines, a task per request, ``abandon`` answered from the loop
    runner      one episode: generate a turn -> tools or the environment's step -> the
                template's tokens -> ...; every limit and failure ends it with a reason
    group       a prompt's n episodes at once -> scored ``Sample``s (the environment's reward,
                or ``task.reward_fn`` on the last answer); the counts of how they ended
"""
