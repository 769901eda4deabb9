"""Shared records: one typed record per unit of data.

A *group* is the unit that moves through the system: one prompt, ``n`` sampled completions,
their rewards and the policy versions that produced every completion token. Actors build
groups, the buffer stores one group per stream entry (one Arrow record batch, see
``buffer/codec.py``), the learner trains on groups.

A multi-turn episode is one ``Sample`` (a single-turn completion is an episode of one turn):
``prompt_ids`` is the first rendered prompt, ``completion_ids`` everything after it, the model
turns and between them the tokens the chat template adds for tool/environment messages and
the next generation prompt; ``loss_mask`` tells the two apart (1 = sampled by the model and
trained, 0 = template/environment, never trained). An agent's episode may keep several call
chains (``episode.agent_export=all``): each is a ``Sample`` of its own, ``part`` 1, 2, ...
after the episode's part 0, with its reward.

Versions: the learner's policy version ``V`` is the number of optimizer steps applied.
Every completion token is tagged with the version of the weights that sampled it
(``token_versions``; a non-model token carries the version of the last model token before
it); a group records ``version_min``/``version_max`` over all its tokens.
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
MAX_ABS_REWARD = 1e6
"""The largest reward magnitude accepted. Formerly -1e300 passed the actor (finite in float64)
and the buffer dropped its groups only when the learner read them, and 1e38 (finite in
float32, its square is not) made the loss inf with no word of the reward; a reward beyond this
is a bug in the function (rewards are usually within +-10), caught where it is produced."""
EPISODE_ENDS: tuple[str, ...] = (
    "done",
    "length",
    "max_turns",
    "max_tokens",
    "env_timeout",
    "env_error",
    "agent_error",
    "agent_timeout",
    "no_call",
)
"""Why an episode ended (``Sample.episode_end``; stored as int8 codes, index in this tuple, so
new kinds are appended, never inserted): ``done`` the environment (or the single turn, or an
agent that returned) ended it; ``length`` the last model turn hit ``sampling.max_tokens``;
``max_turns`` / ``max_tokens`` a limit of the episode cut it; ``env_timeout`` an environment
step or tool overran its deadline; ``env_error`` the environment raised or its process died;
``agent_error`` an agent (``episode.agent``) raised, returned what is no reward, or its process
died; ``agent_timeout`` it overran ``episode.agent_timeout_s``; ``no_call`` it returned
without calling the model (its sample is a placeholder that trains nothing)."""
TRUNCATED_ENDS: tuple[str, ...] = EPISODE_ENDS[1:]
"""The ends that cut an episode short: the learner treats such a sample as truncated
(``algorithm.truncated``), as a completion cut at the length limit."""


@dataclass
class Sample:
    """One completion of a prompt: an episode of one or more model turns (module docstring).

    Invariants: ``len(completion_ids) == len(behavior_logprobs) == len(token_versions) >= 1``;
    ``len(reward_extras) <= MAX_REWARD_EXTRAS``, its values finite (checked by the codec).
    Checked here, with a ``ValueError`` naming the field: ``len(loss_mask) ==
    len(completion_ids)``, its values in {0, 1} and the first 1 (an episode starts with a
    model token); ``turns >= 1``; ``0 <= tool_errors <= tool_calls``; ``episode_end`` in
    ``EPISODE_ENDS``. Non-model tokens (mask 0) carry ``behavior_logprobs`` 0.0.
    """

    prompt_ids: list[int]
    """[P] prompt token ids (same for every sample of a group)."""
    completion_ids: list[int]
    """[C] token ids after the prompt: the model's turns and, between them, the template's
    tool/environment messages and next generation prompt (``loss_mask`` 0)."""
    behavior_logprobs: list[float]
    """[C] log pi_behave(token) as reported by vLLM when it sampled the token (0.0 on a
    non-model token)."""
    token_versions: list[int]
    """[C] policy version of the weights that sampled each token (on a non-model token: that
    of the last model token before it)."""
    reward: float
    """Scalar reward (0.0 when the reward function failed; see ``reward_error``)."""
    finish_reason: str = "stop"
    """One of ``FINISH_REASONS``."""
    reward_error: str = ""
    """Empty when the reward function succeeded, else the reason it failed."""
    reward_extras: dict[str, float] = field(default_factory=dict)
    """The reward dict's other numeric values by key (e.g. verl's ``acc``; ``{}`` for a float
    reward or a failed call): the learner logs their per-step means as ``reward/<key>``."""
    loss_mask: list[int] | None = None
    """[C] 1 = model token (sampled, trained), 0 = template/environment token (never
    trained). A response may open with 0s (what an episode's own first prompt holds beyond
    its group's shared prompt) and may be all 0 (an episode that ended before its first
    model turn: a placeholder that trains nothing). None -> ``[1] * C`` (one turn: every token
    sampled)."""
    turns: int = 1
    """Model turns in the episode (>= 1)."""
    tool_calls: int = 0
    """Tool calls the model made (parsed), >= 0."""
    tool_errors: int = 0
    """Of those, the calls that answered an error (<= ``tool_calls``)."""
    episode_end: str = "done"
    """One of ``EPISODE_ENDS``: why the episode ended."""
    part: int = 0
    """0: an episode's sample (its trajectory; a group has one per episode). k >= 1: the
    episode's k-th other call chain (an agent's calls that did not extend it, kept under
    ``episode.agent_export=all``): it follows its episode's part k-1 in the group and shares
    its reward and ``episode_end``; the learner trains it with the episode's advantage."""

    def __post_init__(self) -> None:
        if self.loss_mask is None:
            self.loss_mask = [1] * len(self.completion_ids)
        if reason := episode_problem(self):
            raise ValueError(f"Sample.{reason}")

    @property
    def model_tokens(self) -> int:
        """Completion tokens the model sampled (``sum(loss_mask)``): the tokens trained."""
        return sum(self.loss_mask or ())


def episode_problem(s: Sample) -> str:
    """What is wrong with ``s``'s episode fields ("" if nothing), starting with the field's
    name: the ``Sample`` checks, run again by the codec's encoder (a sample is mutable)."""
    mask = s.loss_mask if s.loss_mask is not None else [1] * len(s.completion_ids)
    if len(mask) != len(s.completion_ids):
        return f"loss_mask has {len(mask)} values but completion_ids {len(s.completion_ids)}"
    if not set(mask) <= {0, 1}:  # a set, not a loop: a mask may be 100k tokens
        return f"loss_mask values must be 0 or 1, got {sorted(set(mask))}"
    if not isinstance(s.turns, int) or s.turns < 1:
        return f"turns is {s.turns!r}, expected an int >= 1"
    for name in ("tool_calls", "tool_errors"):
        n = getattr(s, name)
        if not isinstance(n, int) or n < 0:
            return f"{name} is {n!r}, expected an int >= 0"
    if s.tool_errors > s.tool_calls:
        return f"tool_errors ({s.tool_errors}) exceeds tool_calls ({s.tool_calls})"
    if s.episode_end not in EPISODE_ENDS:
        return f"episode_end {s.episode_end!r} not in {EPISODE_ENDS}"
    if not isinstance(s.part, int) or s.part < 0:
        return f"part is {s.part!r}, expected an int >= 0"
    return ""


def episode_index(samples: list[Sample]) -> list[int]:
    """[R] the episode of each sample, counted from 0 in order (a part 0 opens the next),
    so ``max + 1`` is the episode count; ValueError when a part k >= 1 does not follow its
    episode's part k-1 (the order ``Group`` keeps)."""
    out, episode, last = [], -1, -1
    for i, s in enumerate(samples):
        if s.part == 0:
            episode += 1
        elif episode < 0:
            raise ValueError(f"sample 0 is part {s.part}: a group opens with an episode's part 0")
        elif s.part != last + 1:
            raise ValueError(f"sample {i} is part {s.part} after part {last}: parts go 0, 1, ...")
        out.append(episode)
        last = s.part
    return out


@dataclass
class Group:
    """One prompt with ``n`` completions: the atomic unit of the buffer. Under
    ``episode.agent_export=all`` an episode may have several samples (``Sample.part``):
    then ``samples`` holds more than ``n`` rows, ``episodes`` the ``n`` part-0 ones.

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
        try:
            episode_index(self.samples)
        except ValueError as e:
            raise ValueError(f"group {self.group_id!r}: {e}") from None
        versions = [v for s in self.samples for v in s.token_versions]
        if self.version_min < 0 and versions:
            self.version_min = min(versions)
        if self.version_max < 0 and versions:
            self.version_max = max(versions)

    @property
    def episodes(self) -> list[Sample]:
        """[n] each episode's sample (part 0): what rewards, advantages and episode metrics
        count (the other parts share their episode's reward)."""
        return [s for s in self.samples if s.part == 0]

    @property
    def rewards(self) -> list[float]:
        """[n] reward of each episode (its part 0's)."""
        return [s.reward for s in self.episodes]

    @property
    def num_tokens(self) -> int:
        """Total completion tokens in the group."""
        return sum(len(s.completion_ids) for s in self.samples)
