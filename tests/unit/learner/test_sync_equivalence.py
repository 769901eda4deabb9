"""At ``max_staleness=0`` the async learner's step is the synchronous on-policy GRPO step.

The reference is an independent implementation: the bare on-policy loop of
``benchmarks.demo.bare_grpo`` (the sync trainer the demo is checked against), which scores,
normalises rewards per group and takes a PPO-clip step with ``old = logprobs.detach()``. The
async path is the learner's ``train_on_batch`` with the default preset (``decoupled_ppo`` +
``grpo``, truncated importance weights) on the same groups, whose behaviour log-probs are the
current policy's own (staleness 0). Same loss, same gradients (compared through one SGD step
with a large learning rate), to float tolerance. A stale batch (behaviour log-probs moved) must
*not* match, so the comparison can fail.
"""

from __future__ import annotations

import random

import pytest
import torch

from asyncrl.core.config.load import load_config
from asyncrl.core.types import Group, Sample
from asyncrl.learner.compute.batch import collate
from asyncrl.learner.compute.model import build_policy
from asyncrl.learner.compute.step import StepContext, train_on_batch
from benchmarks.demo.bare_grpo import grpo_advantages, ppo_clip_loss
from benchmarks.demo.bare_sampling import completion_logprobs

PAD, VOCAB, N, LR = 0, 32, 4, 0.5


def _raw_groups(
    seed: int = 0, n_groups: int = 3
) -> list[tuple[list[int], list[list[int]], list[float]]]:
    """(prompt, completions, rewards) per group, variable lengths, mixed rewards."""
    rng = random.Random(seed)
    out = []
    for _ in range(n_groups):
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 5))]
        comps = [[rng.randrange(1, VOCAB) for _ in range(rng.randint(1, 6))] for _ in range(N)]
        rewards = [rng.choice([0.0, 0.25, 0.5, 1.0]) for _ in range(N)]
        rewards[0], rewards[1] = 0.0, 1.0  # no all-equal group
        out.append((prompt, comps, rewards))
    return out


def _sync_reference(model_dir: str, raw) -> tuple[float, dict[str, torch.Tensor]]:
    """The bare loop's step on ``raw``: (loss, weights after one SGD step)."""
    torch.manual_seed(0)
    model = build_policy(model_dir)
    prompts = [p for p, comps, _ in raw for _ in comps]
    comps = [c for _, cs, _ in raw for c in cs]
    rewards = torch.tensor([r for *_, rs in raw for r in rs])
    logprobs, mask = completion_logprobs(model, prompts, comps, PAD)
    loss = ppo_clip_loss(logprobs, logprobs.detach(), grpo_advantages(rewards, N), mask)
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=LR).step()
    return float(loss.detach()), {k: v.detach().clone() for k, v in model.state_dict().items()}


def _groups(model_dir: str, raw, shift: float = 0.0) -> list[Group]:
    """``raw`` as buffer groups whose behaviour log-probs are the current policy's (+ shift)."""
    model = build_policy(model_dir)
    groups = []
    for i, (prompt, comps, rewards) in enumerate(raw):
        with torch.no_grad():
            lp, _ = completion_logprobs(model, [prompt] * len(comps), comps, PAD)
        samples = [
            Sample(prompt, c, [float(x) + shift for x in lp[j, : len(c)]], [0] * len(c), r)
            for j, (c, r) in enumerate(zip(comps, rewards, strict=True))
        ]
        groups.append(Group(f"g{i}", i, 0, samples))
    return groups


def _async_learner(model_dir: str, groups: list[Group]) -> tuple[float, dict[str, torch.Tensor]]:
    """The learner's step (default preset, staleness 0 config): (loss, weights after SGD)."""
    cfg = load_config(["mode=async", "buffer.max_staleness=0", f"sampling.n_samples={N}",
                       "learner.batch_groups=3", "learner.nproc=1"])  # fmt: skip
    torch.manual_seed(0)
    model = build_policy(model_dir)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ctx = StepContext(model, opt, cfg.algorithm, 0, 1, grad_clip=1e9)
    metrics = train_on_batch(ctx, collate(groups))
    return metrics["loss"], {k: v.detach().clone() for k, v in model.state_dict().items()}


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_staleness_zero_step_equals_the_sync_on_policy_step(tiny_model):
    torch.set_num_threads(1)
    raw = _raw_groups()
    ref_loss, ref_weights = _sync_reference(tiny_model, raw)
    loss, weights = _async_learner(tiny_model, _groups(tiny_model, raw))
    assert loss == pytest.approx(ref_loss, abs=1e-6)
    init = {k: v.clone() for k, v in build_policy(tiny_model).state_dict().items()}
    assert _max_diff(ref_weights, init) > 1e-3, "the step moved nothing: comparison is vacuous"
    assert _max_diff(weights, ref_weights) < 1e-5


def test_a_stale_batch_does_not_match(tiny_model):
    """Behaviour log-probs 0.5 nats off (a stale sampler): importance weights change the step."""
    torch.set_num_threads(1)
    raw = _raw_groups(seed=1)
    _, ref_weights = _sync_reference(tiny_model, raw)
    _, weights = _async_learner(tiny_model, _groups(tiny_model, raw, shift=-0.5))
    assert _max_diff(weights, ref_weights) > 1e-4
