"""The actor role: ``python -m asyncrl.actors.main``, one vLLM engine each. Its rooms:

data/      prompt sources: the demo task, dataset files
engine/    the ``Engine`` protocol: vLLM, or the simulator
episodes/  multi-turn episodes: tool calls in a turn, tools from plain functions
rewards/   reward functions (the built-ins are this package's names), calls, pool, sandbox
weights/   the receiving end of the weight path, registered in vLLM
actor.py (the loop), main.py (the process), claims, groups, slots, validation, control
"""
