"""``sampling``: how completions are sampled, the one group both roles read.

The actors pass these to their engine (vLLM's ``SamplingParams``); the learner reads
``temperature`` (it scores the tempered distribution the actors sampled from), ``max_tokens``
(the overlong penalty and truncation) and ``n_samples`` (rows per batch). Until 2026-11-29 these
keys lived under ``actor.``; a config that still says ``actor.max_tokens`` is refused naming
the new key (``asyncrl/core/config/load.py`` ``MOVED_KEYS``), and a run directory written then
is read with its keys moved (``migrate``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncrl.core.config.checks import bound as _bound
from asyncrl.core.config.checks import require as _require
from asyncrl.core.config.checks import require_finite as _require_finite

MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 10.0
"""``sampling.temperature``'s range (and ``eval.temperature``'s): below, logits / T overflow;
above, the samples are noise."""


@dataclass
class SamplingConfig:
    """Sampling settings of the training completions (validation has its own: ``eval.``)."""

    n_samples: int = 8
    """Completions per prompt (the group size), >= 2: group baselines need two."""
    max_tokens: int = 8
    """Longest completion, in tokens (>= 1). The model preset sets it (configs/model/)."""
    temperature: float = 1.0
    """Sampling temperature, 0.01 .. 10. The learner scores its log-probs at the same
    temperature, dividing the logits by it: 1e-30 made every step non-finite, and 1e6 sampled
    uniform noise and trained on it silently. Greedy validation: ``eval.n_samples=1``."""
    top_p: float = 1.0
    """Nucleus sampling: sample from the smallest set of tokens whose probability reaches
    ``top_p``, 0 < x <= 1 (1 = off). The behaviour log-probs are then those of the truncated,
    renormalized distribution (vLLM ``processed_logprobs``), while the learner scores the full
    one at ``temperature``: below 1 the importance ratio compares two different distributions."""
    top_k: int = -1
    """Sample from the ``top_k`` most likely tokens: -1 = off, else >= 1. Log-probs as for
    ``top_p``."""
    stop: list[str] = field(default_factory=list)
    """Stop strings (non-empty): generation ends once the decoded completion contains one. Its
    tokens stay in the completion (and in training). vLLM matches them on detokenized text, so
    a non-empty list makes the engine detokenize every completion (actors/engine/vllm_engine.py)."""

    def __post_init__(self) -> None:
        _require_finite(self, "sampling")
        _bound(self, "sampling.n_samples", ge=2, hint=" (group baselines need 2+)")
        _bound(self, "sampling.max_tokens", ge=1)
        _bound(
            self,
            "sampling.temperature",
            ge=MIN_TEMPERATURE,
            le=MAX_TEMPERATURE,
            hint=" (1.0 samples the model as it is; RL needs sampling, so for greedy "
            "answers validate with eval.n_samples=1)",
        )
        _bound(self, "sampling.top_p", gt=0, le=1, hint=" (1 = off)")
        _bound(self, "sampling.top_k", ge=-1, hint=" (-1 = off)")
        _require(self.top_k != 0, "sampling.top_k=0: give -1 for no top-k, or k >= 1")
        bad = [s for s in self.stop if not isinstance(s, str) or not s]
        _require(not bad, f"sampling.stop={self.stop!r}: stop strings must be non-empty strings")

    def engine_options(self) -> dict:
        """``Engine.generate``'s keyword options beyond n, max_tokens and temperature."""
        return {"top_p": self.top_p, "top_k": self.top_k, "stop": self.stop}
