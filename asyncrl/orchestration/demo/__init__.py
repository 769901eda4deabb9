"""The CPU demo's own tiny model: tokenizer, Qwen2 model builder, SFT warm start, checks.

- ``tokenizer``: a 64-token character-level tokenizer (byte-level BPE without merges).
- ``model``: ``build_demo_model(out_dir, seed=0, ...)`` writes a random Qwen2 HF directory.
- ``warmstart``: ``prepare_demo_model(cache_dir, seed=0, ...)`` builds + SFTs + caches it.
- ``bare_grpo``: a bare-PyTorch GRPO loop, the learnability sanity check for the demo settings.
- ``check_vllm``: loads a demo directory in vLLM and samples with logprobs (manual check).

Nothing here downloads anything; the task itself lives in ``actors/tasks.py``.
"""
