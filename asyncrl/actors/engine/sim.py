"""SimEngine: a stand-in for ``ActorEngine`` with no model (``actor.engine=sim``).

It lets the learner and the buffer be driven by many actor processes on a small machine
(``benchmarks/demo/scale_sim.py``). Same interface as ``ActorEngine``
(``asyncrl.actors.engine.protocol.Engine``):

- ``generate``: completion lengths are geometric with mean ``mean_len`` (truncated to
  ``[1, max_tokens]``), tokens uniform in ``[0, vocab_size)``, log-probs ``-1.0``, every token
  tagged with the current version; ``top_p``, ``top_k`` and ``stop`` are accepted and ignored
  (uniform tokens have no top set, and there is no text to stop on). The engine produces
  ``tokens_per_s`` tokens per second in total, shared by all requests in flight (a FIFO
  virtual clock: a request finishes when the engine has produced its tokens after those
  submitted before it), which is how a batching engine's throughput behaves once it is
  saturated.
- weight sync is real: the engine joins the learner's weight group as one receiver, through
  the transport the learner names (asyncrl/core/weights/; gloo on CPU), and receives every
  update, discarding the tensors, so the broadcast's cost with many actors is measured, not
  simulated. As in ``ActorEngine``, a
  failed receive marks the weights invalid and generation waits until a later update
  succeeds; ``join_weight_sync`` again joins a rebuilt group.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from asyncrl.actors.engine.vllm_engine import Completion


class SimEngine:
    def __init__(self, vocab_size: int, tokens_per_s: float, mean_len: float, seed: int = 0):
        if tokens_per_s <= 0 or mean_len < 1:
            raise ValueError(f"tokens_per_s={tokens_per_s} must be > 0, mean_len={mean_len} >= 1")
        self.vocab_size, self.tokens_per_s, self.mean_len = vocab_size, tokens_per_s, mean_len
        self.version = 0
        self.weights_valid = True
        self._rng = random.Random(seed)
        self._busy_until = 0.0
        self._receiver = None

    def _length(self, max_tokens: int) -> int:
        p = 1.0 / self.mean_len
        n = 1
        while n < max_tokens and self._rng.random() > p:
            n += 1
        return n

    async def generate(
        self,
        prompt_ids: list[int],
        n: int,
        max_tokens: int,
        temperature: float = 1.0,
        seed: int | None = None,
        **_: Any,
    ) -> list[Completion]:
        while not self.weights_valid:  # a failed sync pauses generation until one succeeds
            await asyncio.sleep(0.05)
        lengths = [self._length(max_tokens) for _ in range(n)]
        now = time.monotonic()
        self._busy_until = max(now, self._busy_until) + sum(lengths) / self.tokens_per_s
        await asyncio.sleep(self._busy_until - now)
        v = self.version
        return [
            Completion(
                token_ids=[self._rng.randrange(self.vocab_size) for _ in range(k)],
                logprobs=[-1.0] * k,
                token_versions=[v] * k,
                finish_reason="length" if k == max_tokens else "stop",
            )
            for k in lengths
        ]

    async def join_weight_sync(self, init_info: dict[str, Any]) -> None:
        from asyncrl.core.weights import transports
        from asyncrl.core.weights.stream import WeightSyncError

        if self._receiver is not None:  # re-join: the learner rebuilt the group
            self._receiver.close()
            self._receiver = None
        try:
            receiver = transports.receiver(init_info.get("transport", ""))
        except ValueError as e:
            raise WeightSyncError(str(e)) from e
        await asyncio.to_thread(receiver.join, init_info, int(init_info["rank_offset"]))
        self._receiver = receiver

    async def update_weights(self, version: int, mode: str = "keep", update_info=None) -> None:
        from asyncrl.core.weights.stream import WeightSyncError

        if self._receiver is None:
            raise WeightSyncError("SimEngine.update_weights before join_weight_sync")
        try:
            await asyncio.to_thread(self._receiver.receive, version, lambda tensors: None)
        except Exception as e:
            self.weights_valid = False
            if isinstance(e, WeightSyncError):
                raise
            raise WeightSyncError(f"weight sync to version {version} failed: {e}") from e
        self.version, self.weights_valid = version, True

    async def shutdown(self) -> None:
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None
