"""Which GPUs and how much of them each process of one node gets.

plan   the GPUs of each process (pure)
share  one GPU for the learner and a vLLM actor: the memory split (pure)
gpus   this node's GPUs as the launcher sees them, and its roles' plan
"""
