"""The generation engine of one actor, behind the ``Engine`` protocol.

protocol     ``Engine``: all an actor needs of an engine (both below implement it)
vllm_engine  ``ActorEngine``: one vLLM ``AsyncLLM``
sim          ``SimEngine``: no model (``actor.engine=sim``), for benchmarks and tests
args         the engine's and one ``generate`` call's arguments (pure)
stop_tokens  the token ids a completion ends at
cpu_layout   ``actor.engine_cpus``: the engine's processes on cores of their own
"""
