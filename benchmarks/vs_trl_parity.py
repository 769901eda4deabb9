"""Parity of TRL's job with asyncrl's, checked on the built ``GRPOTrainer`` before timing.

``check`` compares, through TRL's own code paths (the trainer's ``_tokenize_prompts``,
sampler, ``processing_class.batch_decode`` and ``_calculate_rewards``, which call the wrapped
reward as training will), with asyncrl's (``build_prompt_source``, the actor's
``tokenizer.encode`` / ``decode(skip_special_tokens=True)`` and ``score_call`` on
``load_reward_fn(task.reward_fn)``, actors/actor.py ``make_group``):

- prompts: the first ``cases`` prompts' text and token ids, and that TRL's sampler serves them
  in cursor order, each ``n_samples`` times in a row;
- rewards: ``cases`` prompts x ``len(_completions)`` completions (right, truncated, one digit
  wrong, too long, junk, random token ids): decoded text equal, reward within ``_REWARD_TOL``;
- settings: every hyperparameter the comparison relies on (``_settings``).

A failure is a line in ``failures``; vs_trl.py refuses to report when there is any.
"""

from __future__ import annotations

import random
from pathlib import Path

_REWARD_TOL = 1e-6  # TRL keeps rewards in float32; asyncrl's are Python floats


def check(trainer, cfg, model_dir: str, prompts: list, reward_fn, cases: int = 20) -> dict:
    """``{"passed", "summary", "failures", "cases"}``: see the module docstring."""
    from transformers import AutoTokenizer

    from actors.tasks import build_prompt_source

    ours_tok = AutoTokenizer.from_pretrained(model_dir)  # what the actor loads
    source = build_prompt_source(cfg, model_dir)  # a fresh stream, as an actor builds it
    cases = min(cases, len(prompts))
    failures: list[str] = []
    failures += _prompts(trainer, source, ours_tok, cases)
    failures += _order(trainer, cfg, cases)
    n_rewards, reward_failures = _rewards(trainer, source, ours_tok, reward_fn, cases)
    failures += reward_failures
    settings, setting_failures = _settings(trainer, cfg, model_dir, ours_tok)
    failures += setting_failures
    summary = (f"{cases} prompts (text, ids, order), {n_rewards} rewards, "
               f"{len(settings)} settings; {len(failures)} mismatches")  # fmt: skip
    return {"passed": not failures, "summary": summary, "failures": failures,
            "cases": cases, "rewards_compared": n_rewards, "settings": settings}  # fmt: skip


def _prompts(trainer, source, ours_tok, cases: int) -> list[str]:
    out = []
    for i in range(cases):
        ours = source.get(i)
        theirs = trainer.train_dataset[i]["prompt"]
        if theirs != ours.text:
            out.append(f"prompt {i}: TRL {theirs!r} != asyncrl {ours.text!r}")
            continue
        ids_ours = ours.token_ids or ours_tok.encode(ours.text)
        ids_trl = list(trainer._tokenize_prompts([theirs])[0][0])
        if ids_trl != list(ids_ours):
            out.append(f"prompt {i} ids: TRL {ids_trl} != asyncrl {ids_ours}")
    return out


def _order(trainer, cfg, cases: int) -> list[str]:
    """TRL's sampler: prompt i's ``n`` samples are rows ``i*n .. i*n+n-1``, in cursor order."""
    n = cfg.actor.n_samples
    served = []
    for index in trainer._get_train_sampler():
        served.append(index)
        if len(served) == cases * n:
            break
    want = [i for i in range(cases) for _ in range(n)]
    return (
        []
        if served == want
        else [f"TRL serves prompts {served[: 2 * n]}..., not {want[: 2 * n]}..."]
    )


def _completions(target: str, eos: int, encode, rng: random.Random, vocab: int) -> list[list[int]]:
    wrong = target[:-1] + str((int(target[-1]) + 1) % 10) if target[-1:].isdigit() else target + "0"
    texts = [target, wrong, target + "7", "x" + target, " " + target + " ", "a+b"]
    ids = [encode(t) + [eos] for t in texts]
    ids.append(encode(target))  # truncated: no EOS
    ids.append([rng.randrange(vocab) for _ in range(8)])  # anything the model could sample
    return ids


def _rewards(trainer, source, ours_tok, reward_fn, cases: int) -> tuple[int, list[str]]:
    from actors.rewards import score_call

    rng, out, compared = random.Random(0), [], 0
    for i in range(cases):
        p = source.get(i)
        target = str(p.fields.get("answer", p.fields.get("ground_truth", "0")))
        comps = _completions(target, ours_tok.eos_token_id, ours_tok.encode, rng, len(ours_tok))
        row = trainer.train_dataset[i]
        inputs = [dict(row) for _ in comps]
        texts_trl = trainer.processing_class.batch_decode(comps, skip_special_tokens=True)
        got = trainer._calculate_rewards(inputs, [row["prompt"]] * len(comps), texts_trl, comps)
        got = got[:, 0].tolist()
        for j, ids in enumerate(comps):
            text = ours_tok.decode(ids, skip_special_tokens=True)
            want = score_call(reward_fn, p.text, text, p.fields).value
            compared += 1
            if texts_trl[j] != text:
                out.append(f"prompt {i} completion {ids}: TRL text {texts_trl[j]!r} != {text!r}")
            elif abs(got[j] - want) > _REWARD_TOL:
                out.append(f"prompt {i} completion {text!r}: TRL reward {got[j]} != {want}")
    return compared, out


def _settings(trainer, cfg, model_dir: str, ours_tok) -> tuple[dict, list[str]]:
    """``{name: [asyncrl, TRL]}`` of every setting the comparison relies on, and the mismatches.
    Settings TRL cannot express (another advantage, loss or aggregation) are compared against
    the only value this TRL configuration implements."""
    a, lc, algo = cfg.actor, cfg.learner, cfg.algorithm
    gen, args = trainer.generation_config, trainer.args
    warm = max(1, lc.warmup_steps)
    sched = trainer.lr_scheduler
    lrs_trl = [lc.lr * sched.lr_lambdas[0](s) for s in range(warm + 2)] if sched else None
    dtype = next(trainer.model.parameters()).dtype
    same_model = Path(trainer.model.name_or_path).resolve() == Path(model_dir).resolve()
    pairs = {
        "prompts_per_step": [lc.batch_groups, args.per_device_train_batch_size // trainer.num_generations],
        "samples_per_prompt": [a.n_samples, trainer.num_generations],
        "max_new_tokens": [a.max_tokens, gen.max_new_tokens],
        "temperature": [a.temperature, gen.temperature],
        "top_p": [a.top_p, gen.top_p],
        "top_k (off)": [a.top_k if a.top_k != -1 else 0, gen.top_k or 0],
        "stops_at_eos": [ours_tok.eos_token_id, ours_tok.eos_token_id if ours_tok.eos_token_id in trainer.eos_token_ids else None],
        "optimizer": ["AdamW", type(trainer.optimizer).__name__],
        "lr_by_step": [[lc.lr * min(1.0, (s + 1) / warm) for s in range(warm + 2)], lrs_trl],
        "weight_decay": [lc.weight_decay, trainer.optimizer.defaults["weight_decay"]],
        "grad_clip": [lc.grad_clip, args.max_grad_norm],
        "clip_eps_low_high": [[algo.eps_low, algo.eps_high], [trainer.epsilon_low, trainer.epsilon_high]],
        "aggregation": [algo.aggregation, "token_mean" if trainer.loss_type in ("dapo", "bnpo") else trainer.loss_type],
        "advantage": [algo.advantage, "grpo"],
        "std_normalize": [algo.std_normalize, trainer.scale_rewards == "group"],
        "kl_coef": [algo.kl_coef, trainer.beta],
        "entropy_coef": [algo.entropy_coef, trainer.entropy_coef],
        "updates_per_batch": [algo.ppo_epochs * algo.minibatches, trainer.num_iterations],
        "dynamic_sampling": [algo.dynamic_sampling, False],
        "overlong_frac": [algo.overlong_frac, 0.0],
        "dtype": [cfg.model.dtype, str(dtype).removeprefix("torch.")],
        "gradient_checkpointing": [cfg.model.gradient_checkpointing, bool(args.gradient_checkpointing)],
        "model_dir": [Path(model_dir).name, Path(model_dir).name if same_model else trainer.model.name_or_path],
    }  # fmt: skip
    bad = [
        f"setting {k}: asyncrl {v[0]!r} != TRL {v[1]!r}" for k, v in pairs.items() if v[0] != v[1]
    ]
    return pairs, bad
