"""The ``long_tail`` setting of ``benchmarks/vs_trl/run.py``: a 23.6M-parameter model on addition
with long-tailed answer lengths (measured 2026-11-26: docs/results.md, benchmarks/README.md).

- Task: ``task=file`` on a JSON Lines file of ``"a+b="`` prompts, written per seed from
  ``AdditionSource(seed, digit_weights=DIGIT_WEIGHTS)`` (``data.shuffle=false``: file order is
  the cursor order both systems read), rewarded by ``asyncrl.actors.data.addition:addition_reward`` (the
  file's ``answer`` column). Operands have 1-3 digits 85% of the time, then a geometric tail
  up to 29 digits: answers have a median of 2 digits and 1.6% have 20 or more, so completions
  (answer + EOS) are ~3 tokens at the median and up to 30 (10x); ``sampling.max_tokens=32``.
- Model: the demo's architecture and tokenizer at ``LAYERS`` x ``HIDDEN`` (23.6M parameters),
  warm-started by the demo's recipe (``warmstart.train_sft``: plain and chat-formatted sums,
  label smoothing 0.5) on the same digit distribution (another seed stream) for ``SFT_STEPS``
  steps, cached in ``.cache/asyncrl/vs_trl-long_tail-<hash>``. That SFT took 3.5 s a step on
  the 2 quiet development cores (31 min, once; 10-14 s a step on shared cores). RL improves
  it for 25-40 steps (10-step mean reward 0.07 -> 0.22-0.28), then reward falls on both
  systems. ``--tiny`` uses a 2 x 128 model and 20 SFT steps.

On the demo's 2 cores a step takes 3.5-4.1 s (asyncrl) and 5.9-6.1 s (TRL, which pads every
row to the step's longest prompt and completion), so a full 400-step run of both systems
takes ~5 h: pick ``--steps`` accordingly (100 was measured).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from benchmarks.common import REPO

_TAIL_RATIO = 0.85  # geometric decay of P(digits = d) for d >= 4
DIGIT_WEIGHTS = (0.45, 0.30, 0.10) + tuple(
    0.15 * (1 - _TAIL_RATIO) * _TAIL_RATIO**k / (1 - _TAIL_RATIO**26) for k in range(26)
)
"""P(an operand has 1, 2, ..., 29 digits); sums to 1."""
MAX_TOKENS = 32  # the longest answer (30 digits) + EOS fits
LAYERS, HIDDEN, SFT_STEPS = 6, 512, 300
TINY_MODEL = {"layers": 2, "hidden": 128, "sft_steps": 20}
CACHE = REPO / ".cache" / "asyncrl"  # next to the demo model's cache (model.cache_dir)


def prepare(work: Path, seed: int, steps: int, tiny: bool = False) -> list[str]:
    """Write seed ``seed``'s prompt file, build (or reuse) the model; return the overrides."""
    data = write_prompts(work / "long_tail_data" / f"seed{seed}.jsonl", seed, steps)
    shape = TINY_MODEL if tiny else {"layers": LAYERS, "hidden": HIDDEN, "sft_steps": SFT_STEPS}
    model = build_model(CACHE, **shape)
    tiny_batch = ["learner.batch_groups=4", "sampling.n_samples=4"] if tiny else []
    return [f"model.path={model}", "task=file", f"data.train_files=[{data}]",
            "data.shuffle=false", "data.max_prompt_length=64",
            "task.reward_fn=asyncrl.actors.data.addition:addition_reward", f"sampling.max_tokens={MAX_TOKENS}",
            *tiny_batch]  # fmt: skip


def write_prompts(path: Path, seed: int, steps: int) -> Path:
    """``path``: ``{"prompt", "answer"}`` lines, twice what ``steps`` steps of up to 64 groups
    read (the actors run ahead of the learner), at least 1024."""
    from asyncrl.actors.data.addition import AdditionSource

    source = AdditionSource(seed=seed, digit_weights=DIGIT_WEIGHTS)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for p in source.batch(0, max(1024, 2 * 64 * steps)):
            f.write(json.dumps({"prompt": p.text, "answer": p.fields["answer"]}) + "\n")
    return path


def build_model(cache: Path, layers: int, hidden: int, sft_steps: int) -> Path:
    """The warm-started model directory (built once: temp dir, then renamed into place)."""
    import torch

    from asyncrl.actors.data.addition import AdditionSource
    from asyncrl.orchestration.demo.model import demo_config, init_model, save_model_dir
    from asyncrl.orchestration.demo.tokenizer import build_tokenizer
    from asyncrl.orchestration.demo.warmstart import train_sft, warmstart_key

    key = warmstart_key(layers=layers, hidden=hidden, sft_steps=sft_steps, digits=DIGIT_WEIGHTS)
    final = cache / f"vs_trl-long_tail-{key}"
    if (final / "config.json").is_file():
        return final
    cache.mkdir(parents=True, exist_ok=True)
    print(f"[vs_trl] long_tail: warm-starting a {layers} x {hidden} model, {sft_steps} SFT "
          f"steps -> {final}", flush=True)  # fmt: skip
    model = init_model(demo_config(num_layers=layers, hidden_size=hidden), seed=0)
    source = AdditionSource(seed=1_000_003, digit_weights=DIGIT_WEIGHTS)  # not an RL stream
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        train_sft(model, build_tokenizer(), source, sft_steps, log_every=10)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-vs_trl-", dir=cache))
    try:
        save_model_dir(model, tmp)
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
