"""Build the tiny demo model: a Qwen2-architecture causal LM with the demo tokenizer.

The result is an ordinary Hugging Face model directory (``config.json``, ``model.safetensors``,
``generation_config.json``, tokenizer files) that ``transformers`` and vLLM load like any other
local model. Weights are float32 and a pure function of ``seed`` and the shape arguments.
"""

from __future__ import annotations

from pathlib import Path

from asyncrl.orchestration.demo.tokenizer import save_tokenizer

VOCAB_SIZE = 64
"""Embedding rows: exactly the tokenizer's 64 ids, so every id the model samples decodes."""


def demo_config(
    num_layers: int = 3,
    hidden_size: int = 128,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 256,
    tie_word_embeddings: bool = True,
):
    """Return the ``Qwen2Config`` of the demo model (head_dim = hidden_size / num_heads)."""
    from transformers import Qwen2Config

    from asyncrl.orchestration.demo.tokenizer import build_tokenizer

    tok = build_tokenizer()
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            f"hidden_size={hidden_size} must divide by num_heads={num_heads}, "
            f"which must divide by num_kv_heads={num_kv_heads}"
        )
    return Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tie_word_embeddings,
        use_sliding_window=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
    )


def init_model(config, seed: int = 0):
    """Return a freshly initialised ``Qwen2ForCausalLM`` for ``config``; same seed, same weights.

    The global torch RNG is restored afterwards, so building a model does not perturb the caller.
    """
    import torch
    from transformers import Qwen2ForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.to(torch.float32)


def save_model_dir(model, out_dir: str | Path) -> Path:
    """Save ``model`` (safetensors), its generation config and the demo tokenizer to ``out_dir``."""
    from transformers import GenerationConfig

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    cfg = model.config
    # Only token ids: vLLM takes sampling defaults (temperature, top_p) from this file, and the
    # actor's config must decide those, not the model directory.
    GenerationConfig(
        bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id
    ).save_pretrained(str(out))
    save_tokenizer(out)
    return out


def build_demo_model(
    out_dir: str | Path,
    seed: int = 0,
    num_layers: int = 3,
    hidden_size: int = 128,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    tie_word_embeddings: bool = True,
) -> Path:
    """Write a randomly initialised demo model directory to ``out_dir`` and return its path."""
    config = demo_config(
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        tie_word_embeddings=tie_word_embeddings,
    )
    return save_model_dir(init_model(config, seed), out_dir)
