"""``load_tokenizer`` gives what ``AutoTokenizer`` gives, by the named class when it can, and
leaves everything else to ``AutoTokenizer``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from asyncrl.core.tokenizer import direct_class, load_tokenizer

TEXTS = ["1+2=3", "Hello, world! 123 + 456", "<|im_start|>user\nhi<|im_end|>\n"]
MESSAGES = [{"role": "user", "content": "What is 2+3?"}]


def _same(path) -> None:
    from transformers import AutoTokenizer

    ours, auto = load_tokenizer(path), AutoTokenizer.from_pretrained(str(path))
    assert type(ours) is type(auto)
    for text in TEXTS:
        assert ours(text)["input_ids"] == auto(text)["input_ids"], text
    assert (ours.eos_token_id, ours.pad_token_id, ours.bos_token_id, len(ours)) == (
        auto.eos_token_id,
        auto.pad_token_id,
        auto.bos_token_id,
        len(auto),
    )
    assert ours.all_special_ids == auto.all_special_ids
    if auto.chat_template:
        kw = dict(add_generation_prompt=True, tokenize=False)
        assert ours.apply_chat_template(MESSAGES, **kw) == auto.apply_chat_template(MESSAGES, **kw)


def test_the_demo_model_loads_by_its_class_and_as_autotokenizer_would(tmp_path):
    from asyncrl.orchestration.demo.tokenizer import build_tokenizer

    build_tokenizer().save_pretrained(tmp_path)
    assert direct_class(tmp_path) is not None
    _same(tmp_path)


def test_smollm2_loads_as_autotokenizer_would(smollm2_dir):
    _same(smollm2_dir)


def test_without_a_named_class_or_with_remote_code_autotokenizer_decides(tmp_path):
    assert direct_class(tmp_path) is None  # no tokenizer_config.json
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    assert direct_class(tmp_path) is None
    for config in (
        {},
        {"tokenizer_class": "NoSuchTokenizer"},
        {"tokenizer_class": "os.system"},
        {"tokenizer_class": "Qwen2Tokenizer", "auto_map": {"AutoTokenizer": ["x.Tok", None]}},
    ):
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
        assert direct_class(tmp_path) is None, config


def test_loading_a_named_class_imports_neither_torch_nor_the_auto_models(tmp_path):
    """What it is for: a launcher or actor that loads its tokenizer so pays ~3 CPU-s less."""
    from asyncrl.orchestration.demo.tokenizer import build_tokenizer

    build_tokenizer().save_pretrained(tmp_path)
    code = (
        "import sys; from asyncrl.core.tokenizer import load_tokenizer; "
        f"load_tokenizer({str(tmp_path)!r}); "
        "print(sorted(m for m in ('torch', 'transformers.models.auto.modeling_auto') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize("kw", [{"gguf_file": "model.gguf"}])
def test_a_gguf_file_goes_to_autotokenizer(tmp_path, kw, monkeypatch):
    import transformers

    seen = []
    monkeypatch.setattr(
        transformers.AutoTokenizer, "from_pretrained", lambda path, **k: seen.append((path, k))
    )
    load_tokenizer(tmp_path, **kw)
    assert seen == [(str(tmp_path), kw)]
