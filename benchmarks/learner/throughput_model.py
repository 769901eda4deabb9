"""The learner-throughput benchmark's inputs (``benchmarks.learner.throughput``): the model
shapes it knows (``PRESETS``: the real Qwen2.5-0.5B, 1.5B and 7B shapes, ``cpu`` and ``tiny``;
``smollm2``: the real SmolLM2-135M-Instruct, weights and all) with each preset's batch and arm
settings, the seeded long-tailed batch (a batch of k groups is always the first k groups of
the stream) and the random model saved as a local safetensors directory."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

QWEN = {"model_type": "qwen2", "vocab_size": 151_936, "max_position_embeddings": 32_768,
        "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu"}  # fmt: skip
GPU_BATCH = {"groups": 16, "n": 8, "prompt": 256, "mean": 700.0, "cap": 3072}  # the H100 batch
PRESETS: dict[str, dict] = {
    "qwen2.5-0.5b": {
        "model": {**QWEN, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                  "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True},
        "batch": GPU_BATCH, "budget": 32_768, "chunk": 1024, "checkpointing": True,
        "fit_max_groups": 256,
    },
    "qwen2.5-1.5b": {
        "model": {**QWEN, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                  "num_attention_heads": 12, "num_key_value_heads": 2, "tie_word_embeddings": True},
        "batch": GPU_BATCH, "budget": 32_768, "chunk": 1024, "checkpointing": True,
        "fit_max_groups": 256,
    },
    "qwen2.5-7b": {  # float32 weights + AdamW: 16 bytes/parameter, 122 GB: more than one H100
        "model": {**QWEN, "vocab_size": 152_064, "hidden_size": 3584, "intermediate_size": 18_944,
                  "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                  "tie_word_embeddings": False},
        "batch": GPU_BATCH, "budget": 16_384, "chunk": 1024, "checkpointing": True,
        "fit_max_groups": 128,
    },
    "cpu": {  # Qwen's vocabulary (the logits matter), a body sized for seconds a step on 2 cores
        "model": {**QWEN, "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True,
                  "max_position_embeddings": 4096},
        "batch": {"groups": 4, "n": 4, "prompt": 16, "mean": 44.0, "cap": 192},
        "budget": 1024, "chunk": 256, "checkpointing": False, "fit_max_groups": 16,
        "mem_limit_gib": 8.0,
    },
    "smollm2": {  # the real model (model_path: benchmarks/real_model.py), as `asyncrl run
        # model=smollm2` trains it on the CPU: 8 groups x 4 of examples/smollm2_math, whose chat
        # prompts are 59-64 tokens (62 on average), completions 20 + Exp(80) capped at
        # sampling.max_tokens=256; the run's token budget (configs/learner/cpu.yaml) and log-prob
        # chunk (configs/model/smollm2.yaml); its target: >= 0.9x the bare loop
        "model_path": "smollm2",
        "batch": {"groups": 8, "n": 4, "prompt": 62, "floor": 20, "mean": 80.0, "cap": 256},
        "budget": 512, "chunk": 1024, "checkpointing": False, "fit_max_groups": 32,
        "mem_limit_gib": 8.0, "arms": "asyncrl,bare", "target_vs_bare": 0.9,
    },
    "tiny": {  # the smoke test: seconds
        "model": {**QWEN, "vocab_size": 512, "hidden_size": 32, "intermediate_size": 64,
                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "tie_word_embeddings": True, "max_position_embeddings": 256},
        "batch": {"groups": 2, "n": 4, "prompt": 8, "mean": 12.0, "cap": 48},
        "budget": 128, "chunk": 32, "checkpointing": False, "fit_max_groups": 4,
    },
}  # fmt: skip


# ---------------------------------------------------------------------------- the batch


def _group_seed(seed: int, g: int) -> int:
    return seed * 1_000_003 + g


def completion_lengths(batch: dict, g: int, seed: int) -> list[int]:
    """Group ``g``'s ``n`` completion lengths: ``min(cap, floor + int(Exp(mean)))``, ``floor``
    1 unless the batch says."""
    rng = random.Random(_group_seed(seed, g))
    floor = batch.get("floor", 1)
    return [min(batch["cap"], floor + int(rng.expovariate(1 / batch["mean"])))
            for _ in range(batch["n"])]  # fmt: skip


def real_tokens(batch: dict, groups: int, seed: int) -> int:
    """Prompt + completion tokens of the first ``groups`` groups."""
    return sum(batch["n"] * batch["prompt"] + sum(completion_lengths(batch, g, seed))
               for g in range(groups))  # fmt: skip


def build_batch(batch: dict, groups: int, seed: int, vocab: int):
    """The first ``groups`` groups of the seeded stream, collated (``asyncrl.learner.compute.batch.collate``):
    random token ids, behaviour log-probs in [-4, -0.5], rewards 0/1, all sampled by version 0."""
    import torch

    from asyncrl.core.types import Group, Sample
    from asyncrl.learner.compute.batch import collate

    out = []
    for g in range(groups):
        gen = torch.Generator().manual_seed(_group_seed(seed, g))
        prompt = torch.randint(1, vocab, (batch["prompt"],), generator=gen).tolist()
        samples = []
        for c in completion_lengths(batch, g, seed):
            ids = torch.randint(1, vocab, (c,), generator=gen).tolist()
            lp = (-0.5 - 3.5 * torch.rand(c, generator=gen, dtype=torch.float64)).tolist()
            reward = float(torch.rand((), generator=gen) < 0.5)
            samples.append(Sample(prompt, ids, lp, [0] * c, reward))
        out.append(Group(f"g{g}", g, 0, samples))
    return collate(out)


# ---------------------------------------------------------------------------- the model


def model_config(args, model_dir: str | None = None):
    """The HF config: a real model's (``model_dir``), ``--config`` (a config.json or a model
    directory) or the preset's shape."""
    from transformers import AutoConfig

    if model_dir:
        return AutoConfig.from_pretrained(model_dir)
    if args.config:
        path = Path(args.config)
        raw = json.loads((path / "config.json" if path.is_dir() else path).read_text())
        raw = {k: v for k, v in raw.items() if not k.startswith("_") and k != "architectures"}
        return AutoConfig.for_model(raw.pop("model_type"), **raw)
    shape = dict(PRESETS[args.preset]["model"])
    return AutoConfig.for_model(shape.pop("model_type"), **shape)


def build_model_dir(
    config, work: Path, seed: int, dtype: str, device: str = "cpu"
) -> tuple[Path, dict]:
    """A random model of ``config`` saved as ``work/model-<hash>`` (safetensors, ``dtype``);
    reused when it is already there. Returns the directory and the parameter counts.
    ``device``: where the weights are drawn (``cuda``: seconds instead of about a minute for
    the 1.5B shape; other random values than the CPU's, so the device is in the hash)."""
    import torch
    from transformers import AutoModelForCausalLM

    key = json.dumps([config.to_dict(), seed, dtype] + ([device] if device != "cpu" else []),
                     sort_keys=True, default=str)  # fmt: skip
    out = work / f"model-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    counts_file = out / "param_counts.json"
    if counts_file.is_file():
        return out, json.loads(counts_file.read_text())
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with torch.random.fork_rng(devices=[0] if device == "cuda" else []), torch.device(device):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    params = sum(p.numel() for p in model.parameters())  # a tied head is one parameter
    embed = model.get_input_embeddings().weight.numel()
    head = model.get_output_embeddings().weight
    tied = head is model.get_input_embeddings().weight
    counts = {"n_params": params, "n_params_embedding": embed, "tied_head": tied,
              "n_params_non_embedding": params - embed - (0 if tied else head.numel())}  # fmt: skip
    model.save_pretrained(str(out))
    counts_file.write_text(json.dumps(counts))
    del model
    if device == "cuda":  # the workers need the memory (this process keeps its CUDA context)
        torch.cuda.empty_cache()
    return out, counts
