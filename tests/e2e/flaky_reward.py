"""A reward function that raises on some prompts: the actor must count it, give the group's
sample reward 0 with a reason, and keep going."""

from asyncrl.actors.data.addition import addition_reward


def compute_score(prompt: str, completion: str, **fields) -> float:
    if sum(map(ord, prompt)) % 3 == 0:
        raise RuntimeError("reward server said no")
    return addition_reward(prompt, completion, **fields)
