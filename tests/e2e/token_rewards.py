"""Rewards for runs on the simulated engine (``actor.engine=sim``: completions of uniform random
tokens, which the addition task's reward scores 0 nearly always, so nothing would train)."""


def digit_share(prompt, completion, **fields):
    """The share of the completion's characters that are digits, in [0, 1] (0 when empty):
    a pure function of the text, so two runs that sample the same tokens score them alike."""
    return sum(c.isdigit() for c in completion) / len(completion) if completion else 0.0
