"""``load_tokenizer``: a model directory's tokenizer, as ``AutoTokenizer.from_pretrained``
gives it, without what importing ``AutoTokenizer`` costs.

Importing ``transformers.AutoTokenizer`` (transformers 5) pulls in the auto *model* classes,
the generation utilities and ``torch._dynamo`` through its docstring machinery: 5.1 CPU-s
against 1.9 s for the tokenizer class alone (``python -c "from transformers import ..."`` on
this 2-core machine). A run's launcher and every actor load a tokenizer and need none of that;
a CI runs a few hundred such processes. So when ``tokenizer_config.json`` names a class that
transformers exports (``"tokenizer_class": "Qwen2Tokenizer"``, no ``auto_map`` of remote
code), that class's ``from_pretrained`` loads it: what ``AutoTokenizer`` calls for such a
directory. Anything else (remote code, no config, a GGUF file, a Hub id) goes through
``AutoTokenizer`` unchanged. tests/unit/core/test_tokenizer.py checks both give the same
tokenizer for the demo model and SmolLM2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def load_tokenizer(path: str | Path, **kwargs: Any) -> Any:
    """``AutoTokenizer.from_pretrained(path, **kwargs)``, by the named class when it can."""
    cls = direct_class(path) if not kwargs.get("gguf_file") else None
    if cls is None:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path), **kwargs)
    return cls.from_pretrained(str(path), **kwargs)


def direct_class(path: str | Path) -> Any:
    """The tokenizer class that ``path``'s ``tokenizer_config.json`` names, when transformers
    exports it and the config maps no remote code; else None (``AutoTokenizer`` decides)."""
    try:
        config = json.loads((Path(path) / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    name = config.get("tokenizer_class") if isinstance(config, dict) else None
    if not isinstance(name, str) or not name.isidentifier() or "auto_map" in config:
        return None
    import transformers

    try:
        cls = getattr(transformers, name)
    except (AttributeError, ImportError):
        return None
    return cls if isinstance(cls, type) and hasattr(cls, "from_pretrained") else None
