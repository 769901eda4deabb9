"""``Prompt``: one task instance, as every prompt source (actors/data/tasks.py) yields it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Prompt:
    """One task instance: ``text`` is fed to the model, ``fields`` to the reward function."""

    index: int
    """Position in its source's stream (the cursor value that produced it)."""
    text: str
    """Prompt text, e.g. ``"27+5="``."""
    fields: dict = field(default_factory=dict)
    """JSON-serialisable extras passed to ``compute_score(prompt, completion, **fields)``:
    the addition task's ``a``, ``b`` and ``"answer"`` (the exact expected completion text,
    without EOS); a dataset's columns and ``ground_truth`` (actors/data/datafile.py)."""
    token_ids: list[int] | None = None
    """The prompt's tokens when the source tokenized it (chat-templated prompts); None = the
    actor encodes ``text`` with the model's tokenizer."""
    messages: list[dict] | None = None
    """The prompt as chat messages, when the source has them (a dataset's chat prompts, after
    ``data.prompt_template``): a multi-turn episode starts from these (``row["messages"]``),
    not from the rendered ``text``. None for a plain-text prompt."""
