"""Seeded fake data for tests and benchmarks of the buffer (no Redis, no model needed), and
``add_as_committed``, which plants an unchecked entry the way ``ReplayBuffer.commit`` would."""

from __future__ import annotations

import random
import struct
from typing import TYPE_CHECKING

from asyncrl.core.types import EPISODE_ENDS, FINISH_REASONS, Group, Sample

if TYPE_CHECKING:
    import redis


def f32(x: float) -> float:
    """``x`` rounded to the nearest float32, so it survives the codec bit-exactly."""
    return struct.unpack("f", struct.pack("f", x))[0]


def random_group(
    rng: random.Random,
    group_id: str | None = None,
    *,
    n: int | None = None,
    vocab_size: int = 100,
    versions: tuple[int, int] = (0, 5),
    max_len: int = 16,
    multi_turn: bool = False,
) -> Group:
    """A valid group: ``n`` samples (1..8 if None) sharing one prompt, completions of
    1..``max_len`` tokens in ``[0, vocab_size)``, per-token versions in ``versions`` (inclusive,
    non-decreasing along a completion as in vLLM), float32-exact logprobs <= 0 and rewards,
    and reward extras (``acc``, ``len``) on the samples whose reward did not fail.
    ``multi_turn``: every sample an episode too (``_as_episode``); else one-turn episodes, and
    a seed's groups are what they always were.
    """
    n = n if n is not None else rng.randint(1, 8)
    prompt_index = rng.randrange(10**6)
    actor_id = rng.randrange(64)
    prompt = [rng.randrange(vocab_size) for _ in range(rng.randint(1, max_len))]
    samples = []
    for _ in range(n):
        length = rng.randint(1, max_len)
        start = rng.randint(*versions)
        token_versions = sorted(rng.randint(start, versions[1]) for _ in range(length))
        # drawn in the order they always were, so a seed's groups stay what they were
        completion = [rng.randrange(vocab_size) for _ in range(length)]
        logprobs = [f32(-rng.expovariate(1.0)) for _ in range(length)]
        reward, finish = f32(rng.uniform(-1.0, 1.0)), rng.choice(FINISH_REASONS)
        error = rng.choice(["", "timeout", "bad answer: ∑ ≠ 4"])
        samples.append(
            Sample(
                prompt_ids=list(prompt),
                completion_ids=completion,
                behavior_logprobs=logprobs,
                token_versions=token_versions,
                reward=reward,
                finish_reason=finish,
                reward_error=error,
                reward_extras={} if error else {"acc": float(reward > 0), "len": float(length)},
            )
        )
        if multi_turn:
            _as_episode(rng, samples[-1])
    gid = group_id if group_id is not None else f"{actor_id}:{prompt_index}"
    return Group(group_id=gid, prompt_index=prompt_index, actor_id=actor_id, samples=samples)


def _as_episode(rng: random.Random, s: Sample) -> None:
    """Make ``s`` a multi-turn episode in place: a random ``loss_mask`` (runs of model and
    environment tokens, starting with a model token), its environment tokens carrying log-prob
    0.0 and the version of the model token before them; turns = the model runs, random tool
    calls (<= turns) and errors (<= calls) and a random end."""
    mask = [1]
    for _ in s.completion_ids[1:]:
        mask.append(1 - mask[-1] if rng.random() < 0.3 else mask[-1])
    for j, m in enumerate(mask):
        if not m:
            s.behavior_logprobs[j], s.token_versions[j] = 0.0, s.token_versions[j - 1]
    s.loss_mask = mask
    s.turns = 1 + sum(1 for a, b in zip(mask, mask[1:], strict=False) if (a, b) == (0, 1))
    s.tool_calls = rng.randint(0, s.turns)
    s.tool_errors = rng.randint(0, s.tool_calls)
    s.episode_end = rng.choice(EPISODE_ENDS)


# KEYS: stream, stats, commits   ARGV: field, value, ...   (COMMIT's bookkeeping, no checks)
_ADD_AS_COMMITTED = """
local seq = redis.call('HINCRBY', KEYS[2], 'committed', 1)
local id = redis.call('XADD', KEYS[1], '*', 'seq', seq, unpack(ARGV))
redis.call('HSET', KEYS[3], id, seq)
return id
"""


def add_as_committed(client: redis.Redis, name: str, fields: dict[bytes, bytes]) -> str:
    """XADD ``fields`` into buffer ``name``'s stream as ``ReplayBuffer.commit`` would (counted
    committed, a ``seq`` field and its commit record), but without validating anything: how
    a test plants a bad payload that the buffer must treat as a committed group. Returns the
    entry id. ``fields`` must not hold ``seq``."""
    if b"seq" in fields:
        raise ValueError("add_as_committed sets seq itself")
    keys = [name, f"{name}:stats", f"{name}:commits"]
    args = [x for kv in fields.items() for x in kv]
    entry_id = client.register_script(_ADD_AS_COMMITTED)(keys, args)
    return entry_id.decode() if isinstance(entry_id, bytes) else entry_id


class UnreachableBuffer:
    """A stand-in for ``ReplayBuffer`` where a test's code must not touch the buffer (e.g.
    ``Actor.make_group``): it has the ``name`` that key names are built from; any other
    attribute raises AssertionError, so a call that would reach Redis fails the test."""

    def __init__(self, name: str = "unit") -> None:
        self.name = name

    def __getattr__(self, attr: str):
        raise AssertionError(f"the buffer was used ({attr}) where it must not be")
