"""Shared records: one typed record per unit of data.

A *group* is the unit that moves through the system: one prompt, ``n`` sampled completions,
their rewards and the policy versions that produced every completion token. Actors build
groups, the buffer stores one group per stream entry (one Arrow record batch, see
``buffer/codec.py``), the learner trains on groups.

Versions: the learner's policy version ``V`` is the number of optimizer steps applied.
Every completion token is tagged with the version of the weights that sampled it
(``token_versions``); a group records ``version_min``/``version_max`` over all its tokens.
A group may be trained at learner version ``V`` only if ``V - version_min <= max_staleness``
(the rule lives in ``buffer/staleness.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

FinishReason = Literal["stop", "length", "abort"]
"""Why a completion ended: a stop token, the length limit, or aborted (resubmitted)."""
FINISH_REASONS: tuple[str, ...] = get_args(FinishReason)
"""Allowed ``Sample.finish_reason`` values; stored as int8 codes (index in this tuple)."""
MAX_REWARD_EXTRAS = 32
"""Most ``Sample.reward_extras`` keys: each becomes a ``reward/<key>`` column of every
metrics.jsonl record, so a reward returning a large dict cannot flood the log."""


@dataclass
class Sample:
    """One completion of a prompt.

    Invariants: ``len(completion_ids) == len(behavior_logprobs) == len(token_versions) >= 1``;
    ``len(reward_extras) <= MAX_REWARD_EXTRAS``, its values finite.
    """

    prompt_ids: list[int]
    """[P] prompt token ids (same for every sample of a group)."""
    completion_ids: list[int]
    """[C] sampled token ids."""
    behavior_logprobs: list[float]
    """[C] log pi_behave(token) as reported by vLLM when it sampled the token."""
    token_versions: list[int]
    """[C] policy version of the weights that sampled each token."""
    reward: float
    """Scalar reward (0.0 when the reward function failed; see ``reward_error``)."""
    finish_reason: str = "stop"
    """One of ``FINISH_REASONS``."""
    reward_error: str = ""
    """Empty when the reward function succeeded, else the reason it failed."""
    reward_extras: dict[str, float] = field(default_factory=dict)
    """The reward dict's other numeric values by key (e.g. verl's ``acc``; ``{}`` for a float
    reward or a failed call): the learner logs their per-step means as ``reward/<key>``."""


@dataclass
class Group:
    """One prompt with ``n`` completions: the atomic unit of the buffer.

    ``group_id`` is deterministic (``f"{actor_id}:{prompt_index}"`` by default) so that a
    commit is idempotent: committing the same id twice stores it once.
    """

    group_id: str
    prompt_index: int
    actor_id: int
    samples: list[Sample]
    version_min: int = field(default=-1)
    version_max: int = field(default=-1)

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError(f"group {self.group_id!r} has no samples")
        versions = [v for s in self.samples for v in s.token_versions]
        if self.version_min < 0 and versions:
            self.version_min = min(versions)
        if self.version_max < 0 and versions:
            self.version_max = max(versions)

    @property
    def rewards(self) -> list[float]:
        """[n] reward of each sample."""
        return [s.reward for s in self.samples]

    @property
    def num_tokens(self) -> int:
        """Total completion tokens in the group."""
        return sum(len(s.completion_ids) for s in self.samples)
