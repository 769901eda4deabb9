"""A small character-level tokenizer for the demo model.

Every character of ``ALPHABET`` is one token. The tokenizer is a byte-level BPE *with no merges*
and the same normaliser / pre-tokeniser / decoder pipeline as Qwen2's tokenizer. That choice is
forced: ``transformers`` 5 loads any ``model_type: qwen2`` directory with ``Qwen2Tokenizer``,
which rebuilds that pipeline around the saved vocabulary (vLLM loads through the same code), so
a plain character-level ``WordLevel`` tokenizer would be silently replaced and lose spaces and
newlines. With no merges, byte-level BPE over this vocabulary is exactly one token per character.

Invariants: ``decode(encode(text)) == text`` for any text over ``ALPHABET`` (also when decoded
one token at a time, as vLLM's incremental detokenizer does); characters outside the alphabet
are dropped on encode. Token ids: ``0 = PAD``, ``1 = EOS`` (also BOS), ``2 = UNK``, then the
alphabet in order. No BOS is prepended on encode (like Qwen2): prompt ids are its characters.

The tokenizer has a chat template (``CHAT_TEMPLATE``: ``"<role>: <content>\n"`` per message,
then ``"assistant: "`` as the generation prompt, all in the alphabet), so datasets of chat
messages run on the demo model through the same ``apply_chat_template`` path as on a real one.
The addition task's own prompts are plain text and do not use it; the warm start trains on
chat-formatted sums too (asyncrl/orchestration/demo/warmstart.py ``CHAT_QUESTION``).
"""

from __future__ import annotations

import json
import string
from pathlib import Path

PAD = "<|pad|>"
EOS = "<|endoftext|>"
UNK = "<|unk|>"
SPECIAL_TOKENS = (PAD, EOS, UNK)
ALPHABET = string.digits + " +-*/=().,:;?!\n<>[]{}_'\"%" + string.ascii_lowercase
"""[61] characters with one token each; with the 3 specials the vocabulary has exactly 64 ids,
so every id the model can sample decodes to a character (no spare embedding rows)."""

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
"""Jinja2 chat template of the demo tokenizer (its output uses only ``ALPHABET`` characters
for lowercase roles)."""

# Qwen2's pre-tokenisation regex (transformers/models/qwen2/tokenization_qwen2.py).
_QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def _byte_level_char(ch: str) -> str:
    """The GPT-2 byte-level symbol of a one-byte character (printable ASCII maps to itself)."""
    b = ord(ch)
    if 33 <= b <= 126:
        return ch
    # GPT-2's bytes_to_unicode: non-printable bytes 0..32 map to U+0100 + b (space -> 'Ġ').
    if b <= 32:
        return chr(256 + b)
    raise ValueError(f"character {ch!r} is not in the demo tokenizer's byte range")


def vocabulary() -> dict[str, int]:
    """Token string -> id: specials first, then ``ALPHABET`` as byte-level symbols."""
    symbols = list(SPECIAL_TOKENS) + [_byte_level_char(c) for c in ALPHABET]
    return {tok: i for i, tok in enumerate(symbols)}


def build_tokenizer():
    """Return the demo tokenizer as a ``transformers.PreTrainedTokenizerFast``."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(vocab=vocabulary(), merges=[], unk_token=None, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=EOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
        model_max_length=512,
        chat_template=CHAT_TEMPLATE,
    )


def save_tokenizer(out_dir: str | Path):
    """Build the tokenizer, ``save_pretrained`` it into ``out_dir`` and return it.

    ``tokenizer_class`` is recorded as ``Qwen2Tokenizer`` (what ``AutoTokenizer`` uses for a
    qwen2 directory anyway), so older ``transformers`` versions pick the same class.
    """
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(str(out_dir))
    cfg_path = Path(out_dir) / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    return tokenizer
