"""Supervised warm start of the demo model on the task's answer format, cached on disk.

Every SFT step trains on plain ``a+b=`` prompts (the demo task) and on the same sums asked in
chat form (``CHAT_QUESTION`` through the tokenizer's chat template), so the demo model, like a
real instruct model, answers chat-formatted prompts too (examples/own_task trains on those).
With ``chat_turns`` > 1 (``model.sft_chat_turns``, set by ``experiment=chain``) the chat
examples are conversations of that many chained sums (asyncrl/actors/data/chain.py
``chain_pairs``), token for token as a multi-turn episode holds them (the template's tokens
between turns from ``ChatRenderer.delta_ids``): a model warm-started on single questions
answered the second question of a chain right 0.8% of the time greedily where it answered the
same question asked alone 16% of the time, so RL had little to raise there; warm-started on
chains, 22% (benchmarks/demo/chain_warmstart.py, results/chain_warmstart.json).

RL from a random model would spend its budget learning to emit digits then EOS. A short SFT run
gives a policy that knows the format and, greedily decoded, about half the answers; trained with
label smoothing it stays *under-confident*, so sampled at temperature 1 it often emits a wrong
digit or a stray character and earns a weak reward (~0.2). That is where the RL demo starts; the
rise that GRPO then shows is mostly the policy sharpening onto the answers it can compute (the
classic RLVR effect), plus slower arithmetic gains. Label smoothing also raises the greedy
accuracy of the warm start (it regularises a model this small).

``prepare_demo_model`` is idempotent: its directory is named by a hash of every argument that
changes the weights (and ``WARMSTART_VERSION``), written to a temp dir and renamed into place, so
a killed run never leaves a half-written model behind.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from asyncrl.actors.data.addition import CHAT_QUESTION
from asyncrl.core.runtime.filelock import take_lock

WARMSTART_VERSION = 5
"""Bump when the SFT recipe or the saved model directory changes so stale cached models are
not reused (4: the tokenizer carries a chat template; 5: SFT on chat-formatted questions too)."""
CHAT_BATCH = 16
"""Chat-formatted examples per SFT step, besides ``batch_size`` plain ``a+b=`` ones."""
CHAT_WEIGHT = 0.25
"""Weight of the chat examples' loss beside the plain ones' (1.0). Equal weight halved the
greedy accuracy on plain prompts (0.86 -> 0.41 on 128 eval-split prompts) in this 3-layer
model; a quarter keeps the plain task first and gives the chat form a start that RL raises."""
SFT_STEPS = 500
SFT_LR = 1e-3
SFT_BATCH = 64
SFT_LABEL_SMOOTHING = 0.5
"""Weight of the uniform distribution over the 61 characters in the SFT target."""
BUILD_WAIT_S = 1800.0
"""How long a process waits for another building the same demo model (minutes on 2 cores when
the CPUs are shared); past it, the error names the lock file."""
_FIRST_CHAR_ID = (
    3  # ids 0..2 are PAD, EOS, UNK (asyncrl.orchestration.demo.tokenizer); smoothing skips them
)


def chat_text(tokenizer, prompt) -> str:
    """The addition ``prompt`` asked as ``CHAT_QUESTION`` through the tokenizer's chat template
    (with the generation prompt)."""
    question = CHAT_QUESTION.format(a=prompt.fields["a"], b=prompt.fields["b"])
    messages = [{"role": "user", "content": question}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def chain_example(tokenizer, renderer, prompt, turns: int) -> tuple[list[int], list[int]]:
    """``(ids, labels)`` of ``prompt``'s sum asked as a chain of ``turns`` chat questions
    (``chain_pairs``), each answered with the true sum and EOS: the first question with the
    generation prompt, then per later turn the template's tokens after the answer
    (``renderer.delta_ids``); labels -100 except the answers and their EOS."""
    from asyncrl.actors.data.chain import chain_pairs

    def ask(a: int, b: int) -> dict:
        return {"role": "user", "content": CHAT_QUESTION.format(a=a, b=b)}

    pairs = chain_pairs(int(prompt.fields["a"]), int(prompt.fields["b"]), turns)
    ids = renderer.prompt_ids([ask(*pairs[0])])
    labels = [-100] * len(ids)
    for k, (a, b) in enumerate(pairs):
        if k:
            between = renderer.delta_ids([ask(a, b)], ids)
            ids, labels = ids + between, labels + [-100] * len(between)
        answer = tokenizer.encode(str(a + b)) + [tokenizer.eos_token_id]
        ids, labels = ids + answer, labels + answer
    return ids, labels


def _sft_batch(tokenizer, prompts, chat: bool = False, turns: int = 1) -> tuple:
    """``(ids, attention_mask, labels)`` [B, T], right-padded; labels -100 except answer + EOS.
    ``chat``: each prompt asked through the chat template (``chat_text``), as a chain of
    ``turns`` questions when ``turns`` > 1 (``chain_example``)."""
    import torch

    seqs, labels = [], []
    renderer = None
    if chat and turns > 1:
        from asyncrl.actors.episodes.render import ChatRenderer

        renderer = ChatRenderer(tokenizer)
    for p in prompts:
        if renderer is not None:
            ids, lab = chain_example(tokenizer, renderer, p, turns)
            seqs.append(ids)
            labels.append(lab)
            continue
        prompt = tokenizer.encode(chat_text(tokenizer, p) if chat else p.text)
        answer = tokenizer.encode(p.fields["answer"]) + [tokenizer.eos_token_id]
        seqs.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    lab = torch.full((len(seqs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, lb) in enumerate(zip(seqs, labels, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        lab[i, : len(s)] = torch.tensor(lb)
        mask[i, : len(s)] = 1
    return ids, mask, lab


def sft_loss(model, ids, mask, labels, label_smoothing: float = 0.0):
    """Mean next-token loss over labelled positions, label-smoothed over the character ids.

    Per position: ``(1 - eps) * -log p(label) + eps * mean_c -log p(c)`` with ``c`` ranging over
    the tokenizer's characters (never PAD/UNK, so the policy does not learn to emit them).
    """
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    target = labels[:, 1:]
    valid = target != -100
    logp = logits.log_softmax(-1)
    nll = -logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    smooth = -logp[..., _FIRST_CHAR_ID:].mean(-1)
    per_token = (1 - label_smoothing) * nll + label_smoothing * smooth
    return (per_token * valid).sum() / valid.sum().clamp(min=1)


def train_sft(
    model,
    tokenizer,
    source,
    steps: int,
    lr: float = SFT_LR,
    batch_size: int = SFT_BATCH,
    label_smoothing: float = SFT_LABEL_SMOOTHING,
    log_every: int = 50,
    log: Callable[[str], None] = print,
    chat_turns: int = 1,
) -> list[float]:
    """Run ``steps`` AdamW steps of ``sft_loss`` on ``source`` prompts; return the losses.

    Step ``s`` uses prompts ``s * batch_size .. (s + 1) * batch_size - 1`` of ``source`` as
    plain text, and the first ``CHAT_BATCH`` of them again through the chat template (a
    separate forward pass, so the short plain rows are not padded to the chat rows' length;
    the chat loss weighs ``CHAT_WEIGHT``; ``chat_turns`` > 1: as chains of that many
    questions, ``chain_example``). The learning rate warms up linearly over 5% of the steps,
    then decays by cosine to 10% of ``lr``.
    """
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 20)

    def lr_factor(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (s - warmup) / max(1, steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    model.train()
    losses, t0 = [], time.time()
    for step in range(steps):
        prompts = source.batch(step * batch_size, batch_size)
        plain = sft_loss(model, *_sft_batch(tokenizer, prompts), label_smoothing)
        chat = sft_loss(
            model,
            *_sft_batch(tokenizer, prompts[:CHAT_BATCH], chat=True, turns=chat_turns),
            label_smoothing,
        )
        loss = (plain + CHAT_WEIGHT * chat) / (1 + CHAT_WEIGHT)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if log_every and ((step + 1) % log_every == 0 or step + 1 == steps):
            recent = losses[-log_every:]
            log(
                f"sft step {step + 1}/{steps} loss {sum(recent) / len(recent):.3f} "
                f"({time.time() - t0:.1f}s)"
            )
    model.eval()
    return losses


def warmstart_key(**kwargs) -> str:
    """A short stable hash of the arguments (JSON with sorted keys) and ``WARMSTART_VERSION``."""
    blob = json.dumps({"version": WARMSTART_VERSION, **kwargs}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def prepare_demo_model(
    cache_dir: str | Path,
    seed: int = 0,
    sft_steps: int = SFT_STEPS,
    lr: float = SFT_LR,
    batch_size: int = SFT_BATCH,
    label_smoothing: float = SFT_LABEL_SMOOTHING,
    num_layers: int = 3,
    hidden_size: int = 128,
    log_every: int = 100,
    log: Callable[[str], None] = print,
    chat_turns: int = 1,
    build: bool = True,
) -> Path:
    """Build the demo model, warm-start it with ``sft_steps`` of SFT, save it; return its dir.

    The directory is ``cache_dir/demo-<hash of the arguments>``; if it exists (it only ever
    appears complete, by rename) it is returned at once. About 45 s on one CPU core for the
    default 500 steps; uses the calling process's torch thread setting. One process builds a
    given model at a time (``<dir>.lock``): parallel launches wait for it, reported every 15 s
    and at most ``BUILD_WAIT_S``, then reuse it. ``build=False``: the directory, built or
    not, building nothing (the launcher asks whether it must build: only then does it need
    torch).
    """
    args = dict(seed=seed, sft_steps=sft_steps, lr=lr, batch_size=batch_size)
    args.update(label_smoothing=label_smoothing, num_layers=num_layers, hidden_size=hidden_size)
    if chat_turns != 1:  # only then: the single-turn model keeps its directory
        args["chat_turns"] = chat_turns
    cache = Path(cache_dir)
    final = cache / f"demo-{warmstart_key(**args)}"
    if (final / "config.json").is_file() or not build:
        return final
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / f"{final.name}.lock").open("w") as lock:
        what = f"another process building the demo model {final.name} (lock {lock.name})"
        take_lock(lock, what, log, BUILD_WAIT_S)
        if not (final / "config.json").is_file():  # built while this process waited
            _build(final, args, chat_turns, log_every, log)
    return final


def _build(
    final: Path, args: dict, chat_turns: int, log_every: int, log: Callable[[str], None]
) -> None:
    """Build, warm-start and save the demo model of ``args`` at ``final`` (under its lock)."""
    import torch

    from asyncrl.actors.data.addition import AdditionSource
    from asyncrl.orchestration.demo.model import demo_config, init_model, save_model_dir
    from asyncrl.orchestration.demo.tokenizer import build_tokenizer

    seed, num_layers, hidden_size = args["seed"], args["num_layers"], args["hidden_size"]
    t0 = time.time()
    log(f"warm start: building demo model {args} -> {final}")
    model = init_model(demo_config(num_layers=num_layers, hidden_size=hidden_size), seed=seed)
    # SFT data: a seed stream of the train split other than the RL stream (which uses `seed`).
    source = AdditionSource(seed=1_000_003 + seed, split="train")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        losses = train_sft(
            model,
            build_tokenizer(),
            source,
            args["sft_steps"],
            args["lr"],
            args["batch_size"],
            args["label_smoothing"],
            log_every,
            log,
            chat_turns,
        )
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-demo-", dir=final.parent))
    try:
        save_model_dir(model, tmp)
        meta = {**args, "final_loss": losses[-1] if losses else None, "version": WARMSTART_VERSION}
        (tmp / "warmstart.json").write_text(json.dumps(meta, indent=2) + "\n")
        os.rename(tmp, final)
    except OSError:
        if not (final / "config.json").is_file():  # not a lost race with another writer
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"warm start: done in {time.time() - t0:.1f}s -> {final}")
