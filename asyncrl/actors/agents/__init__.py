"""Agents that own their loop: an OpenAI-compatible endpoint on the actor, whose calls are
recorded token for token as the run's samples (``episode.agent``; wired into the actor by
``asyncrl.actors.groups.agent_groups``).

    messages  a request's messages checked, made canonical and hashed by prefix
    policy    a call's sampling settings: the run's, whatever was asked (overrides counted)
    record    one episode's calls: first / extend / fork / new, tokens from the record,
              budgets, the segment exported
    keys      per-episode API keys: mint, resolve by sha256, revoke (ended keys remembered)
    server    ``AgentServer``: aiohttp on loopback, ``/v1/models``, ``/v1/chat/completions``
    spec      the agent a user writes (a function, or a class per episode), loaded by spec and
              its signature checked; ``call_agent``; ``check_result`` of what it returns
    agent_worker  the worker process running agents (``EnvPool(..., module=AGENT_WORKER)``:
              the environments' pool, deadlines and failures); ops open / run / close
    runner    one episode: key, the agent's run in its worker, the end, the segment exported
              as an ``episodes.runner.Episode``; ``AgentCounts`` (``actor<i>.json`` ``agents``)
"""
