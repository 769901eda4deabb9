"""One episode's tokens, token for token: what the model sampled and what the template added.

A ``Trajectory`` starts from the episode's first messages (``prompt_ids``, rendered once by
``ChatRenderer.prompt_ids``) and grows by turns: ``add_model_turn`` appends the sampled ids
exactly as vLLM returned them (never decoded and re-encoded), ``add_messages`` appends the
tokens the chat template adds for the environment's or tools' messages and the next generation
prompt (``ChatRenderer.delta_ids(messages, trajectory.ids)``), masked out of the loss. So the
tokens trained are the tokens sampled, whatever the template would make of the conversation if
it were rendered again; ``rerender_mismatch`` counts how much that re-render would differ
(Qwen3's template, for one, strips earlier ``<think>``).

    prompt_ids  [P]  system + user + generation prompt
    ids         [C]  turn 1 | env tokens | turn 2 | env tokens | ... | turn k
    mask        [C]  1 ... 1 | 0 ...... 0 | 1 ... 1 | 0 ...... 0 | ... | 1 ... 1
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from asyncrl.actors.episodes.render import ChatRenderer, Message


@dataclass
class Trajectory:
    """One episode as token ids: ``Trajectory(renderer.prompt_ids(messages), messages)``.

    Invariants: ``ids``, ``mask``, ``logprobs`` and ``versions`` have one entry per token;
    once a model turn is added ``mask[0] == 1``; a token with mask 0 has logprob 0.0 and the
    version of the last model token before it (so the versions' min/max are the model
    tokens'); model turns and message steps alternate, starting with a model turn.
    """

    prompt_ids: list[int]
    """[P] the first messages rendered with the generation prompt."""
    messages: list[Message]
    """The conversation for logging: the first messages, each model turn as an assistant
    message of its decoded text, each environment or tool message."""
    ids: list[int] = field(default_factory=list)
    """[C] every token after the prompt."""
    mask: list[int] = field(default_factory=list)
    """[C] 1 = sampled by the model (trained), 0 = added by the template (never trained)."""
    logprobs: list[float] = field(default_factory=list)
    """[C] log pi_behave of each model token as sampled; 0.0 for template tokens."""
    versions: list[int] = field(default_factory=list)
    """[C] policy version that sampled each model token; template tokens copy the last one."""
    turn_starts: list[int] = field(default_factory=list)
    """[turns] where each model turn starts in ``ids``."""

    def __post_init__(self) -> None:
        self.messages = [dict(m) for m in self.messages]

    @property
    def turns(self) -> int:
        """Model turns so far."""
        return len(self.turn_starts)

    @property
    def model_tokens(self) -> int:
        """Tokens the model sampled: ``sum(mask)``."""
        return sum(self.mask)

    @property
    def awaits_messages(self) -> bool:
        """True after a model turn (the next step is the environment's messages)."""
        return bool(self.mask) and self.mask[-1] == 1

    def add_model_turn(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        versions: Sequence[int],
        text: str,
    ) -> None:
        """Append one sampled turn: its ``[T]`` ids, log-probs and per-token versions exactly
        as sampled (end-of-turn token included when sampled), and its decoded ``text``."""
        n = len(token_ids)
        if n == 0:
            raise ValueError("a model turn has at least one token")
        if len(logprobs) != n or len(versions) != n:
            raise ValueError(
                f"a model turn of {n} tokens needs as many logprobs and versions; got "
                f"{len(logprobs)} and {len(versions)}"
            )
        if self.awaits_messages:
            raise ValueError("two model turns in a row; add the environment's messages between")
        self.turn_starts.append(len(self.ids))
        self.ids += [int(t) for t in token_ids]
        self.mask += [1] * n
        self.logprobs += [float(p) for p in logprobs]
        self.versions += [int(v) for v in versions]
        self.messages.append({"role": "assistant", "content": text})

    def add_messages(self, messages: Sequence[Message], ids: Sequence[int]) -> None:
        """Append the environment's (or tools') ``messages`` after a model turn, as the ``ids``
        the template renders for them with the next generation prompt (mask 0):
        ``ids = renderer.delta_ids(messages, trajectory.ids)``, computed first so the caller
        can hold them against its token budget."""
        if not self.awaits_messages:
            raise ValueError(
                "messages follow a model turn; give all of one step's messages in one call"
            )
        added = [int(t) for t in ids]
        self.ids += added
        self.mask += [0] * len(added)
        self.logprobs += [0.0] * len(added)
        self.versions += [self.versions[-1]] * len(added)
        self.messages += [dict(m) for m in messages]

    def sample_fields(self) -> dict[str, Any]:
        """The ``Sample`` fields of this episode (``core.types.Sample(**fields, reward=...,
        finish_reason=..., ...)``): copies of the token lists, by the Sample's names."""
        if not self.turns:
            raise ValueError("an episode without a model turn is no sample")
        return {
            "prompt_ids": list(self.prompt_ids),
            "completion_ids": list(self.ids),
            "behavior_logprobs": list(self.logprobs),
            "token_versions": list(self.versions),
            "loss_mask": list(self.mask),
            "turns": self.turns,
        }


def rerender_mismatch(trajectory: Trajectory, renderer: ChatRenderer) -> int:
    """How many tokens a re-render of the whole conversation (``trajectory.messages`` through
    ``apply_chat_template`` at once, as a trainer that re-tokenizes would) gets wrong:
    ``max(len(ours), len(rerendered))`` less the tokens the two share in their longest common
    alignment (``difflib``), so a sampled ``" ans" "wer"`` re-encoded as ``" answer"`` counts
    2 and a stripped ``<think>`` block its length, not every position after it. 0: the
    template and the tokenizer reproduce the trajectory exactly.

    A trajectory that ends with a model turn is compared as the template would close it
    (``ChatRenderer.end_ids``, e.g. the ``"\\n"`` after ``<|im_end|>``)."""
    ends_with_model = trajectory.awaits_messages
    ours = trajectory.prompt_ids + trajectory.ids
    if ends_with_model:
        ours = ours + renderer.end_ids(renderer.closes(trajectory.ids))
    theirs = renderer.render_ids(trajectory.messages, add_generation_prompt=not ends_with_model)
    matcher = difflib.SequenceMatcher(None, ours, theirs, autojunk=False)
    shared = sum(block.size for block in matcher.get_matching_blocks())
    return max(len(ours), len(theirs)) - shared
