"""A model directory checked as one unit before anything starts: its config, its
weights, its tokenizer, and the tokenizer's size against the model's vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

_WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json")


def check_model_dir(path: Path, key: str, weights: bool = True) -> None:
    """Raise ``FileNotFoundError``/``ValueError`` naming the file when ``path`` is not a
    loadable Hugging Face model directory, checked as one unit before anything starts: no or
    unreadable ``config.json``, no weights, no tokenizer or one larger than the vocabulary."""
    config = path / "config.json"
    if not config.is_file():
        raise FileNotFoundError(
            f"{key}={str(path)!r} is not a Hugging Face model directory (no config.json "
            "there); give a local model directory, or model.path=demo for the built-in tiny model"
        )
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(
            f"{config} cannot be read as JSON ({e}); fix or re-download the model"
        ) from None
    if not isinstance(data, dict) or "vocab_size" not in data:
        raise ValueError(f"{config} has no 'vocab_size': not a transformers model config")
    if weights and not any(next(path.glob(p), None) for p in _WEIGHT_FILES):
        raise FileNotFoundError(
            f"{key}={str(path)!r} has no weights: no *.safetensors or pytorch_model*.bin "
            "files next to config.json; copy the model's weight files there"
        )
    check_tokenizer(path, key, data["vocab_size"])


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def check_tokenizer(path: Path, key: str, vocab_size: int) -> None:
    """Raise naming the fix when ``path`` has no tokenizer, or one whose ids run past the
    model's ``vocab_size`` embedding rows (without tokenizer files transformers
    built an empty tokenizer, every prompt was empty, and the run hung or crashed later)."""
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        raise FileNotFoundError(
            f"{key}={str(path)!r} has no tokenizer ({', '.join(_TOKENIZER_FILES)}: none "
            "there); copy the model's tokenizer files next to config.json"
        )
    from asyncrl.core.tokenizer import load_tokenizer

    try:
        tok = load_tokenizer(path)
    except Exception as e:  # transformers' own errors: the message is what matters
        raise ValueError(f"{key}={str(path)!r}: its tokenizer cannot be loaded: {e}") from None
    if len(tok) > vocab_size:
        raise ValueError(
            f"{key}={str(path)!r}: the tokenizer has {len(tok)} tokens but config.json's "
            f"vocab_size is {vocab_size}, so token ids >= {vocab_size} have no embedding; "
            "the tokenizer and the weights are from different models: use the model's own"
        )


def count_params(path: Path) -> int:
    """The parameters stored in ``path``'s ``*.safetensors`` files, read from their headers
    only (no tensor is loaded); 0 when there are none (``pytorch_model*.bin``: not read).

    A safetensors file starts with an 8-byte little-endian header length and a JSON header
    mapping each tensor's name to its ``shape`` (``__metadata__`` aside). Tied weights are
    stored once, as transformers saves them."""
    total = 0
    for file in sorted(path.glob("*.safetensors")):
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        for name, info in header.items():
            if name != "__metadata__":
                n = 1
                for dim in info["shape"]:
                    n *= dim
                total += n
    return total
