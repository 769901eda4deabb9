"""What a finished vLLM request becomes: a ``Completion`` (token ids, behaviour log-probs,
one weight version per token), read from vLLM's ``CompletionOutput`` (``_completion``):
its flat log-probs (``_sampled_logprobs``) and its weight-version spans
(``token_versions_from_spans``), or one version for every token (a LoRA adapter's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from asyncrl.core.types import FINISH_REASONS, FinishReason


@dataclass
class Completion:
    """One sampled completion. Invariant: the three lists have equal length."""

    token_ids: list[int]
    """[C] sampled token ids."""
    logprobs: list[float]
    """[C] log pi_behave(token), as vLLM computed it when sampling (see ``logprobs_mode``)."""
    token_versions: list[int]
    """[C] weight version that sampled each token."""
    finish_reason: FinishReason


def token_versions_from_spans(spans: Sequence[Any] | None, num_tokens: int) -> list[int]:
    """Expand vLLM ``WeightVersionSpan``s (``.version: str, .start, .end``) to one int per token.

    Spans must tile ``[0, num_tokens)`` in order; anything else means a token has no known
    version, which would silently corrupt staleness accounting, so it raises ValueError.
    """
    if num_tokens == 0:
        return []
    if not spans:
        raise ValueError(f"no weight-version spans for {num_tokens} tokens")
    out: list[int] = []
    for span in spans:
        if span.start != len(out) or span.end <= span.start:
            raise ValueError(f"weight-version spans do not tile the output: {list(spans)}")
        try:
            version = int(span.version)
        except ValueError:
            raise ValueError(f"non-integer weight version label {span.version!r}") from None
        out.extend([version] * (span.end - span.start))
    if len(out) != num_tokens:
        raise ValueError(f"weight-version spans cover {len(out)} of {num_tokens} tokens")
    return out


def _completion(out: Any, version: int | None = None) -> Completion:
    """Convert a finished ``vllm.CompletionOutput`` (requested with ``logprobs=0``);
    ``version``: every token's (a LoRA adapter's version), else vLLM's weight-version spans."""
    reason = str(out.finish_reason)
    if reason == "repetition":  # vLLM's repetition detector stopped it: a normal stop
        reason = "stop"
    if reason not in FINISH_REASONS:
        raise RuntimeError(f"generation failed inside vLLM (finish_reason={reason!r})")
    ids = list(out.token_ids)
    logprobs = _sampled_logprobs(out.logprobs, ids)
    if version is None:
        versions = token_versions_from_spans(out.weight_versions, len(ids))
    else:
        versions = [version] * len(ids)
    return Completion(ids, logprobs, versions, reason)  # type: ignore[arg-type]


def _sampled_logprobs(lps: Any, ids: list[int]) -> list[float]:
    """[C] the log-prob of each sampled token ``ids[i]``, from vLLM's per-position log-probs.

    ``generate`` asks for ``flat_logprobs=True``: a ``vllm.logprobs.FlatLogprobs`` keeps flat
    lists, position i's entries at ``start_indices[i]:end_indices[i]`` with the sampled token
    first (vllm/v1/engine/logprobs.py), instead of one ``{token: Logprob}`` dict per token,
    which vLLM's client builds on every engine step (8% of the actor process's Python time
    in a profile of the demo actor). A plain list of dicts (another vLLM, a fake) is read as
    such. Raises ValueError if a position is missing or names another token.
    """
    starts = getattr(lps, "start_indices", None)
    if starts is None:
        lps = lps or []
        if len(lps) != len(ids):
            raise ValueError(f"vLLM returned log-probs for {len(lps)} of {len(ids)} tokens")
        return [float(lps[i][tok].logprob) for i, tok in enumerate(ids)]
    if len(starts) != len(ids) or any(
        lps.token_ids[s] != t for s, t in zip(starts, ids, strict=True)
    ):
        raise ValueError("vLLM's flat log-probs do not match the sampled tokens")
    values = lps.logprobs
    return [float(values[s]) for s in starts]
