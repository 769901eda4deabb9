"""Every numeric config field has a declared range, checked at its boundaries.

``BOUNDS`` maps each int / float field (Optional ones too) of the schema to
``(last accepted, first refused)`` pairs, one per bounded side; a field added to
asyncrl/core/config/job.py without an entry here fails ``test_every_numeric_field_has_bounds``.
Sub-configs are built directly (fast, and clear of Config's cross-field rules); the last
tests go through ``load_config`` for the text a user sees.
"""

from __future__ import annotations

import math
import re
import typing
from dataclasses import fields, is_dataclass

import pytest

from asyncrl.core.config.job import SEED_MAX, ActorConfig, Config
from asyncrl.core.config.load import ConfigError, load_config

NoneType = type(None)
BOUNDS: dict[str, list[tuple[float, float]]] = {
    "model.sft_steps": [(0, -1)],
    "model.sft_chat_turns": [(1, 0), (4, 5)],
    "model.logprob_chunk_tokens": [(0, -1)],
    "model.lora.rank": [(0, -1), (1024, 1025)],
    "model.lora.alpha": [(1e-3, 0.0)],
    "model.lora.dropout": [(0.0, -0.1), (0.99, 1.0)],
    "task.seed": [(0, -1), (SEED_MAX, SEED_MAX + 1)],
    "task.reward_timeout_s": [(1e-3, 0.0)],
    "task.max_reward_error_frac": [(0.0, -1e-9), (1.0, 1.000001)],
    "task.reward_error_window": [(1, 0)],
    "task.reward_workers": [(1, 0), (256, 257)],
    "task.reward_memory_mb": [(-1, -2)],
    "data.max_prompt_length": [(1, 0)],
    "data.epochs": [(1, 0)],
    "buffer.reconnect_s": [(1e-3, 0.0)],
    "buffer.claim_ttl_s": [(1e-3, 0.0)],
    "buffer.stop_grace_s": [(0.0, -1e-9)],
    "buffer.port": [(0, -1), (65535, 65536)],
    "actor.num_actors": [(1, 0)],
    "actor.nnodes": [(1, 0)],
    "sampling.n_samples": [(2, 1)],
    "sampling.max_tokens": [(1, 0)],
    "sampling.temperature": [(0.01, 0.0099), (10.0, 10.01)],
    "episode.max_turns": [(1, 0)],
    "episode.max_tokens": [(0, -1)],
    "episode.env_timeout_s": [(1e-6, 0.0)],
    "episode.env_workers": [(1, 0), (64, 65)],
    "episode.max_env_failure_frac": [(0.0, -1e-9), (1.0, 1.000001)],
    "episode.env_failure_window": [(1, 0)],
    "episode.agent_timeout_s": [(1e-6, 0.0)],
    "episode.agent_port": [(0, -1), (65535, 65536)],
    "actor.max_inflight": [(1, 0)],
    "actor.max_num_seqs": [(0, -1)],
    "actor.kv_cache_gib": [(0.0, -1e-9)],
    "actor.gpu_memory_utilization": [(1e-6, 0.0), (1.0, 1.000001)],
    "learner.gpu_memory_fraction": [(1e-6, 0.0), (1.0, 1.000001)],
    "actor.tensor_parallel_size": [(1, 0)],
    "actor.max_model_len": [(0, -1)],  # at least the data's needs: test_actor_gpu_config.py
    "sampling.top_p": [(1e-6, 0.0), (1.0, 1.000001)],
    "sampling.top_k": [(-1, -2)],  # and 0 refused (-1 = off): test_actor_gpu_config.py
    "actor.cpu_threads": [(1, 0)],
    "actor.sim_tokens_per_s": [(1e-3, 0.0)],
    "actor.sim_mean_len": [(1.0, 0.999)],
    "actor.restart_max": [(0, -1)],
    "actor.learner_wait_s": [(1e-3, 0.0)],
    "learner.nproc": [(1, 0)],
    "learner.nnodes": [(1, 0)],
    "learner.node_rank": [(0, -1)],
    "learner.steps": [(1, 0)],
    "learner.batch_groups": [(1, 0)],
    "learner.micro_batch_rows": [(0, -1)],
    "learner.max_tokens_per_micro_batch": [(0, -1)],
    "learner.lr": [(1e-12, 0.0), (1.0, 1.0001)],
    "learner.warmup_steps": [(0, -1)],
    "learner.weight_decay": [(0.0, -1e-9)],
    "learner.grad_clip": [(1e-6, 0.0)],
    "learner.sync_every": [(1, 0)],
    "learner.checkpoint_every": [(0, -1)],
    "learner.keep_checkpoints": [(0, -1)],
    "learner.max_weight_norm_jump": [(0.0, -1.0), (1.5, 1.0)],
    "learner.cpu_threads": [(1, 0)],
    "learner.max_wall_s": [(0.0, -1e-9)],
    "learner.data_timeout_s": [(1e-3, 0.0)],
    "learner.actor_wait_s": [(1e-3, 0.0)],
    "learner.weight_sync_timeout_s": [(1e-3, 0.0)],
    "learner.restart_max": [(0, -1)],
    "learner.max_nonfinite_steps": [(1, 0)],
    "algorithm.gamma": [(1e-9, 0.0), (1.0, 1.000001)],
    "algorithm.lam": [(0.0, -1e-9), (1.0, 1.000001)],
    "algorithm.eps_low": [(0.0, -1e-9), (0.999, 1.0)],
    "algorithm.eps_high": [(0.0, -1e-9)],
    "algorithm.clip_c": [(1.001, 1.0)],
    "algorithm.is_cap": [(1e-6, 0.0)],
    "algorithm.mask_low": [(0.0, -1e-9), (1.999, 2.0)],  # upper: < mask_high (2.0)
    "algorithm.mask_high": [(0.501, 0.5)],  # > mask_low (0.5)
    "algorithm.cispo_eps_low": [(0.0, -1e-9), (0.999, 1.0)],
    "algorithm.cispo_eps_high": [(0.0, -1e-9)],
    "algorithm.kl_coef": [(0.0, -1e-9)],
    "algorithm.entropy_coef": [(0.0, -1e-9)],
    "algorithm.critic_lr": [(1e-12, 0.0)],
    "algorithm.value_clip": [(1e-6, 0.0)],
    "algorithm.overlong_frac": [(0.0, -1e-9), (1.0, 1.000001)],
    "algorithm.overlong_penalty": [(0.0, -1e-9)],
    "algorithm.truncated_reward": [],  # any finite number (a reward); nonzero needs penalize
    "algorithm.ppo_epochs": [(1, 0)],
    "algorithm.minibatches": [(1, 0)],
    "buffer.capacity": [(0, -1)],
    "buffer.max_staleness": [(0, -1)],
    "buffer.lease_ttl_s": [(0.001, 0.0009)],
    "buffer.max_deliveries": [(1, 0)],
    "eval.every": [(0, -1)],
    "eval.n_samples": [(1, 0), (1024, 1025)],
    "eval.temperature": [(0.01, 0.0099), (10.0, 10.01)],
    "eval.max_prompts": [(0, -1)],
    "eval.pass_threshold": [],  # any finite number (rewards are any float)
    "eval.timeout_s": [(1e-3, 0.0)],
    "eval.chunk_prompts": [(1, 0)],
    "eval.prompts_in_flight": [(1, 0)],
    "eval.log_samples": [(0, -1), (64, 65)],
    "seed": [(0, -1), (SEED_MAX, SEED_MAX + 1)],
    "metrics_port": [(0, -1), (65533, 65534)],  # actor 0 (of 1) serves on metrics_port + 2
    "role_log_max_mb": [(0.001, 0.0)],
    "role_log_backups": [(0, -1), (100, 101)],
    "role_log_line_chars": [(80, 79)],
}


def numeric_fields(cls: type = Config, prefix: str = "") -> dict[str, tuple[type, bool]]:
    """``{"learner.lr": (float, False), "task.seed": (int, True), ...}``: every int / float
    field under ``cls``, with whether it is Optional."""
    out = {}
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        hint, key = hints[f.name], prefix + f.name
        if is_dataclass(hint):
            out |= numeric_fields(hint, key + ".")
            continue
        args = typing.get_args(hint)
        base = next((a for a in args if a is not NoneType), hint)
        if base in (int, float):
            out[key] = (base, NoneType in args)
    return out


FIELDS = numeric_fields()
FLOATS = sorted(k for k, (t, _) in FIELDS.items() if t is float)
CASES = [(key, ok, bad) for key, pairs in BOUNDS.items() for ok, bad in pairs]


def build(key: str, value: object) -> object:
    """The dataclass that owns ``key``, built with ``key=value`` and defaults elsewhere."""
    group, _, name = key.rpartition(".")
    cls: type = Config
    for part in filter(None, group.split(".")):  # model.lora.rank: Config -> model -> lora
        cls = typing.get_type_hints(cls)[part]
    return cls(**{name: value})


def test_every_numeric_field_has_bounds():
    assert sorted(FIELDS) == sorted(BOUNDS), (
        "declare the range of every int/float config field in BOUNDS (and check it in the "
        f"dataclass's __post_init__): missing {sorted(set(FIELDS) - set(BOUNDS))}, "
        f"stale {sorted(set(BOUNDS) - set(FIELDS))}"
    )


@pytest.mark.parametrize(("key", "ok", "bad"), CASES, ids=[f"{k}:{b}" for k, _, b in CASES])
def test_boundary(key, ok, bad):
    kind, _ = FIELDS[key]
    assert type(ok) is kind and type(bad) is kind, f"{key}: give {kind.__name__} boundary values"
    assert getattr(build(key, ok), key.rpartition(".")[2]) == ok
    with pytest.raises(ValueError, match=re.escape(key)):
        build(key, bad)


@pytest.mark.parametrize("key", [k for k, (_, opt) in FIELDS.items() if opt])
def test_optional_fields_take_null(key):
    build(key, None)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("key", FLOATS)
def test_non_finite_floats_are_refused(key, value):
    with pytest.raises(ValueError, match=re.escape(f"{key}={value} is not a finite number")):
        build(key, value)


def test_metrics_ports_of_every_actor_fit():
    Config(metrics_port=65532, actor=ActorConfig(num_actors=2))
    with pytest.raises(ValueError, match=r"metrics_port=65533 with 2 actor\(s\)"):
        Config(metrics_port=65533, actor=ActorConfig(num_actors=2))
    with pytest.raises(ValueError, match=r"metrics_port=65532 with 4 actor\(s\)"):
        Config(metrics_port=65532, actor=ActorConfig(num_actors=2, nnodes=2))


USER_MISTAKES = [
    ("learner.lr=inf", "learner.lr=inf is not a finite number"),
    ("learner.lr=nan", "learner.lr=nan is not a finite number"),
    ("learner.grad_clip=-1", "learner.grad_clip must be > 0 (for no clipping give e.g. 1e9)"),
    ("learner.grad_clip=0", "learner.grad_clip must be > 0"),
    ("learner.max_wall_s=-1", "learner.max_wall_s must be >= 0 (0 = no limit), got -1.0"),
    ("learner.data_timeout_s=-1", "learner.data_timeout_s must be > 0, got -1.0"),
    ("learner.weight_sync_timeout_s=inf", "learner.weight_sync_timeout_s=inf is not a fin"),
    ("buffer.lease_ttl_s=0", "buffer.lease_ttl_s must be >= 0.001, got 0.0"),
    ("buffer.name=", "buffer.name='': give a non-empty name of letters, digits and _ - . :"),
    ("buffer.name=a/b", "buffer.name='a/b': give a non-empty name"),
    ("task.name=nope", "task.name='nope' is not a known task; known tasks: addition, file"),
    ("learner.steps=abc", "learner.steps: expected an integer, got 'abc'"),
    ("learner.steps=1.5", "learner.steps: expected an integer, got 1.5"),
    ("learner.lr=abc", "learner.lr: expected a number, got 'abc'"),
    ("learner.weight_sync=maybe", "learner.weight_sync: expected true or false, got 'maybe'"),
    ("algorithm.clip_c=x", "algorithm.clip_c: expected a number or null, got 'x'"),
    ("seed=-1", "seed must be >= 0 and <= 2147483647, got -1"),
    ("metrics_port=70000", "metrics_port must be >= 0 and <= 65535 (0 = off), got 70000"),
    ("actor.kv_cache_gib=-1", "actor.kv_cache_gib must be >= 0 (0 = vLLM sizes it, on a GPU)"),
    ("learner.cpu_threads=0", "learner.cpu_threads must be >= 1, got 0"),
]


@pytest.mark.parametrize(("override", "message"), USER_MISTAKES, ids=[o for o, _ in USER_MISTAKES])
def test_user_mistake_is_a_config_error(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config([override])


def test_micro_batches_by_rows_and_by_tokens_are_exclusive():
    cfg = load_config(["learner.max_tokens_per_micro_batch=4096"])
    assert (cfg.learner.micro_batch_rows, cfg.learner.max_tokens_per_micro_batch) == (0, 4096)
    message = (
        "learner.micro_batch_rows=4 and learner.max_tokens_per_micro_batch=4096 both form "
        "micro-batches"
    )
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(["learner.max_tokens_per_micro_batch=4096", "learner.micro_batch_rows=4"])
    with pytest.raises(ConfigError, match="learner.pack_sequences=true packs micro-batches formed"):
        load_config(["learner.max_tokens_per_micro_batch=0", "learner.pack_sequences=true"])
    packed = load_config(["learner.max_tokens_per_micro_batch=64", "learner.pack_sequences=true"])
    assert packed.learner.pack_sequences is True
    assert load_config([]).learner.pack_sequences is None  # auto
