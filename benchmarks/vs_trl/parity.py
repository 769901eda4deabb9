"""Parity of TRL's job with asyncrl's, checked on the built ``GRPOTrainer`` before timing.

``check`` compares, through TRL's own code paths (the trainer's ``_tokenize_prompts``,
sampler, ``processing_class.batch_decode`` and ``_calculate_rewards``, which call the wrapped
reward as training will), with asyncrl's (``build_prompt_source``, the actor's
``tokenizer.encode`` / ``decode(skip_special_tokens=True)`` and ``score_call`` on
``load_reward_fn(task.reward_fn)``, actors/actor.py ``make_group``):

- prompts: the first ``cases`` prompts' text and token ids, and that TRL's sampler serves them
  in cursor order, each ``n_samples`` times in a row;
- rewards: ``cases`` prompts x ``len(_completions)`` completions (right, truncated, one digit
  wrong, too long, junk, ``\\boxed{}`` right, wrong and empty, random token ids): decoded
  text equal, reward within ``_REWARD_TOL``;
- validation (``vs_trl_validation``): TRL's validation prompts' ids equal to asyncrl's
  (``build_val_source``), all ``validation_size`` of them;
- settings: every hyperparameter the comparison relies on (``_settings``), the stop token ids
  (asyncrl's ``model_stop_token_ids`` against TRL's ``eos_token_ids``) and validation's.

A failure is a line in ``failures``; vs_trl.py refuses to report when there is any.
"""

from __future__ import annotations

import random
from pathlib import Path

from benchmarks.vs_trl.validation import validation_of

_REWARD_TOL = 1e-6  # TRL keeps rewards in float32; asyncrl's are Python floats


def check(trainer, cfg, model_dir: str, prompts: list, reward_fn, cases: int = 20) -> dict:
    """``{"passed", "summary", "failures", "cases"}``: see the module docstring."""
    from transformers import AutoTokenizer

    from asyncrl.actors.data.tasks import build_prompt_source

    ours_tok = AutoTokenizer.from_pretrained(model_dir)  # what the actor loads
    source = build_prompt_source(cfg, model_dir)  # a fresh stream, as an actor builds it
    cases = min(cases, len(prompts))
    failures: list[str] = []
    failures += _prompts(trainer, source, ours_tok, cases)
    failures += _order(trainer, cfg, cases)
    failures += _val_prompts(trainer, cfg, model_dir, ours_tok)
    n_rewards, reward_failures = _rewards(trainer, source, ours_tok, reward_fn, cases)
    failures += reward_failures
    settings, setting_failures = _settings(trainer, cfg, model_dir, ours_tok)
    failures += setting_failures
    summary = (f"{cases} prompts (text, ids, order), {n_rewards} rewards, "
               f"{len(validation_of(trainer).prompts)} validation prompts, "
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
    """TRL's sampler: prompt i's ``n`` samples are rows ``i*n .. i*n+n-1``, in cursor order,
    for the first ``cases`` prompts or all that training reads (``steps x batch_groups``: the
    sampler drops a last incomplete batch of the dataset). The sampler repeats each generation
    batch ``steps_per_generation`` times (once per micro-batch); the first is generated from."""
    n, per_gen = cfg.sampling.n_samples, trainer.args.generation_batch_size
    repeat = trainer.num_iterations * trainer.args.steps_per_generation
    cases = min(cases, cfg.learner.steps * cfg.learner.batch_groups)
    blocks = -(-cases * n // per_gen)  # generation batches holding the first `cases` prompts
    served = []
    for index in trainer._get_train_sampler():
        served.append(index)
        if len(served) == blocks * repeat * per_gen:
            break
    used = [i for b in range(0, len(served), repeat * per_gen) for i in served[b : b + per_gen]]
    used, want = used[: cases * n], [i for i in range(cases) for _ in range(n)]
    if used == want:
        return []
    return [f"TRL generates from prompts {used[: 2 * n]}... ({len(used)}), not "
            f"{want[: 2 * n]}... ({len(want)})"]  # fmt: skip


def _val_prompts(trainer, cfg, model_dir: str, ours_tok) -> list[str]:
    """TRL's validation prompts (token ids) against a fresh asyncrl validation source."""
    from asyncrl.actors.data.tasks import build_val_source
    from asyncrl.actors.validation import validation_size

    source = build_val_source(cfg, model_dir, log=lambda _: None)
    size = validation_size(cfg, source) if source is not None else 0
    theirs = validation_of(trainer).prompt_ids
    if len(theirs) != size:
        return [f"validation: TRL has {len(theirs)} prompts, asyncrl {size}"]
    out = []
    for i in range(size):
        p = source.get(i)
        ids = list(p.token_ids or ours_tok.encode(p.text))
        if list(theirs[i]) != ids:
            out.append(f"validation prompt {i} ids: TRL {list(theirs[i])} != asyncrl {ids}")
    return out


def _completions(target: str, eos: int, encode, rng: random.Random, vocab: int) -> list[list[int]]:
    wrong = target[:-1] + str((int(target[-1]) + 1) % 10) if target[-1:].isdigit() else target + "0"
    texts = [target, wrong, target + "7", "x" + target, " " + target + " ", "a+b",
             f"So the answer is \\boxed{{{target}}}.", f"\\boxed{{{wrong}}} and then {target}",
             f"{target} is \\boxed{{}}"]  # fmt: skip
    ids = [encode(t) + [eos] for t in texts]
    ids.append(encode(target))  # truncated: no EOS
    ids.append([rng.randrange(vocab) for _ in range(8)])  # anything the model could sample
    return ids


def _rewards(trainer, source, ours_tok, reward_fn, cases: int) -> tuple[int, list[str]]:
    from asyncrl.actors.rewards.calls import score_call

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
    s, lc, algo = cfg.sampling, cfg.learner, cfg.algorithm
    gen, args = trainer.generation_config, trainer.args
    warm = max(1, lc.warmup_steps)
    sched = trainer.lr_scheduler
    lrs_trl = [lc.lr * sched.lr_lambdas[0](s) for s in range(warm + 2)] if sched else None
    from asyncrl.actors.engine.stop_tokens import model_stop_token_ids

    dtype = next(trainer.model.parameters()).dtype
    val, e = validation_of(trainer), cfg.eval
    same_model = Path(trainer.model.name_or_path).resolve() == Path(model_dir).resolve()
    pairs = {
        "prompts_per_step": [lc.batch_groups, args.generation_batch_size // trainer.num_generations],
        "optimizer_steps_per_generation": [1, args.steps_per_generation // args.gradient_accumulation_steps],
        "samples_per_prompt": [s.n_samples, trainer.num_generations],
        "max_new_tokens": [s.max_tokens, gen.max_new_tokens],
        "temperature": [s.temperature, gen.temperature],
        "logprob_temperature": [s.temperature, trainer.temperature],  # the loss's log-probs
        "top_p": [s.top_p, gen.top_p],
        "top_k (off)": [s.top_k if s.top_k != -1 else 0, gen.top_k or 0],
        "stop_token_ids": [model_stop_token_ids(model_dir), sorted(trainer.eos_token_ids)],
        "stop_strings": [list(s.stop), []],
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
        "val_greedy (eval.n_samples=1)": [e.n_samples == 1, True],
        "val_max_new_tokens": [s.max_tokens, val.max_new_tokens],
        "val_steps (at_start, every, at_end)": [[e.at_start, e.every, e.at_end], [val.schedule.at_start, val.schedule.every, val.schedule.at_end]],
        "val_pass_threshold": [e.pass_threshold, val.schedule.pass_threshold],
        "val_stop_token_ids": [model_stop_token_ids(model_dir), sorted(val.stop_ids)],
        "model_dir": [Path(model_dir).name, Path(model_dir).name if same_model else trainer.model.name_or_path],
    }  # fmt: skip
    bad = [
        f"setting {k}: asyncrl {v[0]!r} != TRL {v[1]!r}" for k, v in pairs.items() if v[0] != v[1]
    ]
    return pairs, bad
