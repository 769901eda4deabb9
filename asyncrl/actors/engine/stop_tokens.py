"""The token ids a completion ends at: the model's EOS ids from ``generation_config.json``, the
tokenizer's EOS token, and the special token the chat template closes an assistant turn with.

vLLM 0.32 (``generation_config="auto"``, our engines' setting) stops a request at its
tokenizer's ``eos_token_id`` and adds ``generation_config.json``'s ``eos_token_id`` (an int or
a list) to the request's ``stop_token_ids`` (``SamplingParams.update_from_generation_config``,
called by ``vllm/v1/engine/input_processor.py``). It misses two cases:

- a chat template whose end-of-turn token is neither of those: a base model's tokenizer ends
  text with ``<|endoftext|>`` while its template closes turns with ``<|im_end|>``, so a model
  trained on that template answers, writes ``<|im_end|>``, and runs on to the length limit;
- an engine started with ``skip_tokenizer_init``: no tokenizer, so no tokenizer EOS.

``ActorEngine`` therefore passes the union of the three as ``stop_token_ids`` of every request
(``actors/engine/vllm_engine.py``; none with ``ignore_eos``): completions end the same way whatever vLLM's
tokenizer and generation-config handling. vLLM keeps the stop token as the completion's last
token (and its log-prob), so the policy is trained to stop.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

_PROBE = "asyncrl end of turn probe"
"""An assistant message's content, found again in the rendered chat to read what follows."""
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def union_stop_ids(*sources: int | Iterable[int] | None) -> list[int]:
    """Sorted distinct token ids from ints, lists of ints and Nones (absent ids)."""
    out: set[int] = set()
    for s in sources:
        if s is None:
            continue
        out.update([s] if isinstance(s, int) else s)
    return sorted(int(i) for i in out)


def special_ids(tokenizer: Any) -> set[int]:
    """Ids of the tokenizer's special tokens: the named ones (bos, eos, pad, additional) and
    every added token flagged special (Llama 3's ``<|eot_id|>`` is only the latter)."""
    ids = set(getattr(tokenizer, "all_special_ids", ()))
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return ids | {i for i, tok in added.items() if getattr(tok, "special", False)}


def chat_end_of_turn(tokenizer: Any) -> int | None:
    """The special token the chat template writes right after an assistant message's content
    (``<|im_end|>`` in ChatML, ``<|eot_id|>`` in Llama 3, ``<end_of_turn>`` in Gemma), or None:
    no template, a template that refuses a plain user/assistant exchange, or plain text after
    the content (the demo tokenizer's ``"\\n"``)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    chat = [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": _PROBE}]
    try:
        text = tokenizer.apply_chat_template(chat, tokenize=False)
    except Exception:  # a template may raise on any shape it dislikes (jinja raise_exception)
        return None
    _, found, tail = str(text).partition(_PROBE)
    ids = tokenizer.encode(tail.lstrip(), add_special_tokens=False) if found else []
    return ids[0] if ids and ids[0] in special_ids(tokenizer) else None


def generation_eos_ids(model_dir: str | Path) -> int | list[int] | None:
    """``eos_token_id`` of the model's generation config, as vLLM reads it: from
    ``generation_config.json``, else derived from ``config.json``; None if neither has one."""
    from transformers import AutoConfig, GenerationConfig

    try:
        return GenerationConfig.from_pretrained(str(model_dir)).eos_token_id
    except OSError:  # no generation_config.json
        pass
    try:
        config = AutoConfig.from_pretrained(str(model_dir))
    except (OSError, ValueError):
        return None
    return GenerationConfig.from_model_config(config).eos_token_id


def model_stop_token_ids(model_dir: str | Path) -> list[int]:
    """The stop token ids of the model in ``model_dir``: generation config EOS ids, the
    tokenizer's EOS and its chat template's end-of-turn token (those it has)."""
    from asyncrl.core.tokenizer import load_tokenizer

    tokenizer = None
    # without its files transformers 5 still builds a tokenizer (an empty one, "EOS" id 0)
    if any((Path(model_dir) / name).is_file() for name in _TOKENIZER_FILES):
        tokenizer = load_tokenizer(model_dir)
    tokenizer_eos = getattr(tokenizer, "eos_token_id", None)
    end_of_turn = chat_end_of_turn(tokenizer) if tokenizer is not None else None
    return union_stop_ids(generation_eos_ids(model_dir), tokenizer_eos, end_of_turn)
