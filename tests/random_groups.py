"""Random groups for learner tests: one home for what tests/unit/learner/test_step_critic.py and
tests/unit/learner/test_truncation.py both draw."""

from __future__ import annotations

import random

from asyncrl.core.types import Group, Sample


def random_groups(
    n_groups: int = 4, n: int = 4, seed: int = 0, vocab: int = 32, cut: dict | None = None
) -> list[Group]:
    """``n_groups`` groups of ``n`` samples from ``random.Random(seed)``: prompts of 2-4 and
    completions of 1-5 token ids in ``1..vocab-1``, behaviour log-probs in [-4, -0.5], version
    0, reward 0 or 1. ``cut[g]`` lists the samples of group ``g`` that end at the length limit
    (``finish_reason="length"``); it draws nothing, so the other fields do not depend on it."""
    rng, cut = random.Random(seed), cut or {}
    groups = []
    for g in range(n_groups):
        prompt = [rng.randrange(1, vocab) for _ in range(rng.randint(2, 4))]
        samples = []
        for i in range(n):
            c = rng.randint(1, 5)
            samples.append(Sample(prompt, [rng.randrange(1, vocab) for _ in range(c)],
                                  [-rng.uniform(0.5, 4.0) for _ in range(c)], [0] * c,
                                  float(rng.random() < 0.5),
                                  "length" if i in cut.get(g, ()) else "stop"))  # fmt: skip
        groups.append(Group(f"g{g}", g, 0, samples))
    return groups
