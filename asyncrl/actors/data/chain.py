"""The multi-turn demo: a chain of sums, one per turn, each starting from the last true sum.

    user:      what is 12+5? answer with the number only.
    assistant: 17
    user:      what is 17+3? answer with the number only.
    assistant: 20                                         -> reward (1.0 + 1.0) / 2

``ChainAddition`` is an environment (asyncrl/actors/episodes/env.py ``Environment``) over the
addition task's prompts (``task.name=addition``: the row's ``a`` and ``b``): ``TURNS`` questions,
each asked in the chat form the demo model was warm-started on (``CHAT_QUESTION``), each
answer scored by ``addition_reward`` (partial credit per digit) against the true sum. The next
question adds a small number to the true sum, not to the model's answer, so one wrong turn
does not doom the next. The episode's reward is the mean score of its turns (each step
returns its score / ``TURNS``). Deterministic: the added numbers come from a hash of the row.
It is the fast end-to-end multi-turn task (a few seconds a step on the demo model); it returns
plain tuples, so it imports nothing of asyncrl's episode code.
"""

from __future__ import annotations

import hashlib

from asyncrl.actors.data.addition import CHAT_QUESTION, addition_reward

TURNS = 2
"""Questions per episode."""


def _addend(a: int, b: int, turn: int) -> int:
    """The number added at ``turn`` (>= 1): 1..20, a pure function of the first sum."""
    digest = hashlib.sha256(f"chain:{a}+{b}:{turn}".encode()).digest()
    return 1 + digest[0] % 20


def chain_pairs(a: int, b: int, turns: int = TURNS) -> list[tuple[int, int]]:
    """The ``(a, b)`` asked at each of ``turns`` turns: ``(a, b)``, then the true sum and the
    next addend (what ``ChainAddition`` asks; the demo model's multi-turn warm start,
    asyncrl/orchestration/demo/warmstart.py, asks the same)."""
    pairs = [(a, b)]
    for turn in range(1, turns):
        x, y = pairs[-1]
        pairs.append((x + y, _addend(x, y, turn)))
    return pairs


class ChainAddition:
    """``TURNS`` chained sums; see the module docstring. ``partial_credit=False``
    (``+episode.env_kwargs.partial_credit=false``) scores a turn 1 only for the exact sum."""

    def __init__(self, partial_credit: bool = True) -> None:
        self.partial_credit = partial_credit

    def reset(self, row: dict) -> list[dict]:
        self.a, self.b, self.turn = int(row["a"]), int(row["b"]), 0
        return [self._question()]

    def step(self, message: dict) -> tuple[list[dict], float, bool, dict]:
        total = self.a + self.b
        score = addition_reward("", message.get("content") or "", answer=str(total))
        if not self.partial_credit:
            score = float(score == 1.0)
        self.turn += 1
        if self.turn >= TURNS:
            return [], score / TURNS, True, {"exact": float(score == 1.0)}
        self.a, self.b = total, _addend(self.a, self.b, self.turn)
        return [self._question()], score / TURNS, False, {}

    def _question(self) -> dict:
        return {"role": "user", "content": CHAT_QUESTION.format(a=self.a, b=self.b)}
