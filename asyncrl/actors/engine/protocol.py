"""``Engine``: what an actor needs of a generation engine, and all it may use.

Implemented by ``asyncrl.actors.engine.vllm_engine.ActorEngine`` (vLLM) and ``asyncrl.actors.engine.sim.SimEngine`` (no
model); unit tests implement it with small scripted fakes and build a real ``Actor`` on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from asyncrl.actors.engine.vllm_engine import Completion


@runtime_checkable
class Engine(Protocol):
    """A generation engine with versioned weights.

    Invariants an actor relies on: ``generate`` returns ``n`` completions whose per-token
    lists have equal length and whose ``token_versions`` name the weights that sampled each
    token; after a failed ``join_weight_sync`` or ``update_weights`` (``WeightSyncError``)
    ``weights_valid`` is False until a later ``update_weights`` succeeds.
    """

    weights_valid: bool
    """False after a failed weight sync: the weights may be half-updated."""
    version: int
    """The version of the weights it holds now (what its next token is tagged with)."""

    async def generate(
        self,
        prompt_ids: list[int],
        n: int,
        max_tokens: int,
        temperature: float = 1.0,
        seed: int | None = None,
        *,
        top_p: float = 1.0,
        top_k: int = -1,
        stop: Sequence[str] = (),
    ) -> list[Completion]:
        """``n`` completions of ``prompt_ids`` (sample ``i`` seeded ``seed + i``); a weight
        update with ``mode="abort"`` may end some with ``finish_reason="abort"``. ``top_p``
        (1 = off), ``top_k`` (-1 = off) and ``stop`` (stop strings) narrow the sampling; the
        log-probs are those of the distribution sampled, after all of them."""
        ...

    async def join_weight_sync(self, init_info: dict[str, Any]) -> None:
        """Join (or re-join) the learner's weight group described by ``init_info``."""
        ...

    async def update_weights(self, version: int, mode: str = "keep") -> None:
        """Receive weight version ``version``; ``mode`` is ``keep`` or ``abort`` (what happens
        to requests in flight)."""
        ...

    async def shutdown(self) -> None:
        """Stop the engine and everything it started (idempotent)."""
        ...
