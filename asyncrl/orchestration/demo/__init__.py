"""The CPU demo's own tiny model: tokenizer, Qwen2 model builder, SFT warm start.

- ``tokenizer``: a 64-token character-level tokenizer (byte-level BPE without merges).
- ``model``: ``build_demo_model(out_dir, seed=0, ...)`` writes a random Qwen2 HF directory.
- ``warmstart``: ``prepare_demo_model(cache_dir, seed=0, ...)`` builds + SFTs + caches it.

Dev tools for the demo live outside the product: ``benchmarks/demo/bare_grpo.py`` (a
bare-PyTorch GRPO loop, the learnability check of the demo settings) and
``scripts/check_vllm.py`` (loads a demo directory in vLLM and samples with logprobs).

Nothing here downloads anything; the task itself lives in ``actors/data/tasks.py``.
"""
