"""``check_model_dir`` checks a model directory as one unit before anything starts: config,
weights, tokenizer, and the tokenizer's size against the model's vocabulary."""

from __future__ import annotations

import json

import pytest

from asyncrl.orchestration.demo.tokenizer import save_tokenizer
from asyncrl.orchestration.models.directory import check_model_dir


def _model(tmp_path, vocab: int | None, tokenizer: bool):
    path = tmp_path / "model"
    path.mkdir()
    n = len(save_tokenizer(path)) if tokenizer else 32
    (path / "config.json").write_text(json.dumps({"vocab_size": vocab or n}))
    (path / "model.safetensors").write_bytes(b"not read by the check")
    return path, n


def test_a_complete_directory_passes(tmp_path):
    path, _ = _model(tmp_path, None, tokenizer=True)
    check_model_dir(path, "model.path")


def test_a_directory_without_tokenizer_files_is_refused_naming_them(tmp_path):
    path, _ = _model(tmp_path, None, tokenizer=False)
    with pytest.raises(FileNotFoundError, match=r"has no tokenizer \(tokenizer\.json, "):
        check_model_dir(path, "model.path")


def test_a_tokenizer_larger_than_the_vocabulary_is_refused_with_both_sizes(tmp_path):
    path, n = _model(tmp_path, 8, tokenizer=True)
    with pytest.raises(ValueError, match=rf"the tokenizer has {n} tokens but config\.json's "
                                         r"vocab_size is 8, so token ids >= 8"):  # fmt: skip
        check_model_dir(path, "model.path")
