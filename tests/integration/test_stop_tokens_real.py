"""The stop tokens of the real SmolLM2-135M-Instruct (``smollm2_dir``: converted once from its
GGUF file into .cache/asyncrl, ~30 s the first time): its generation config's EOS, its
tokenizer's EOS and the token its chat template closes a turn with are all ``<|im_end|>``
(id 2), so completions end at the end of the assistant's turn (actors/engine/stop_tokens.py)."""

from __future__ import annotations

import pytest

from asyncrl.actors.engine.stop_tokens import (
    chat_end_of_turn,
    generation_eos_ids,
    model_stop_token_ids,
)

transformers = pytest.importorskip("transformers")


def test_smollm2_ends_completions_at_im_end(smollm2_dir):
    tok = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    assert tok.convert_ids_to_tokens(2) == "<|im_end|>"
    assert (tok.eos_token_id, chat_end_of_turn(tok)) == (2, 2)
    assert generation_eos_ids(smollm2_dir) in (2, [2])
    assert model_stop_token_ids(smollm2_dir) == [2]
