"""The check that multi-turn samples hold what the policy sampled: vLLM scores every sample
teacher-forced (``engine.logprobs_of``) and each model token's recorded log-prob must match
within ``tol``. Shared by test_episodes_vllm.py (environments) and test_agents_vllm.py
(agents through the endpoint)."""

from __future__ import annotations

import asyncio


def check_teacher_forced(engine, samples, loop, tol: float) -> None:
    """Every masked-in token of ``samples`` scored teacher-forced agrees with its recorded
    behaviour log-prob within ``tol``; not vacuous (some model token is checked, and the
    count equals the samples' ``model_tokens``)."""

    async def score():
        return await asyncio.gather(
            *(engine.logprobs_of(s.prompt_ids, s.completion_ids) for s in samples)
        )

    forced = loop.run_until_complete(score())
    model_tokens = 0
    for s, lps in zip(samples, forced, strict=True):
        for m, sampled, teacher in zip(s.loss_mask, s.behavior_logprobs, lps, strict=True):
            if m:
                model_tokens += 1
                assert abs(sampled - teacher) <= tol
    assert model_tokens == sum(s.model_tokens for s in samples) > 0
