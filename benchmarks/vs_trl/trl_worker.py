"""The TRL side of ``benchmarks/vs_trl/run.py``: TRL's ``GRPOTrainer`` on the asyncrl job's config.

    python -m benchmarks.vs_trl.trl_worker --out DIR --t0 EPOCH_S --threads 2 -- <asyncrl overrides>

One process, as a user of TRL runs it. Everything the job is made of comes from the asyncrl
config composed with the same overrides as the ``asyncrl run`` it is compared with: the model
directory (``resolve_model``: the cached warm-started demo model), the prompts
(``build_prompt_source``, cursor order 0, 1, 2, ...), the reward (``load_reward_fn`` on
``task.reward_fn``, called through ``score_call`` as the actor calls it) and every
hyperparameter (``trl_settings``). ``vs_trl_parity.check`` compares both sides before
training; when it fails the worker writes ``parity.json`` and exits 3 without training.

Writes into ``--out``: ``parity.json`` (not with ``--skip-parity``), ``steps.jsonl`` (per
optimizer step: ``step``, ``t_proc_s`` = seconds since ``--t0`` (the parent's spawn time),
``t_train_s`` = seconds since TRL's ``on_train_begin`` (the first step's generation is inside
step 1), ``reward`` (mean over the step's samples), ``completion_tokens`` (mean) and
``completion_tokens_p95`` (stop token included, as asyncrl's ``response_len_*``)),
``val.jsonl`` (one line per validation: ``vs_trl_validation.GreedyValidation``, at asyncrl's
``eval`` steps) and ``done.json`` (``startup_s``, ``val_seconds``, the settings used, threads).

Stopping: TRL stops a completion at the model's ``generation_config.eos_token_id`` and the
tokenizer's EOS; the worker sets the former to asyncrl's stop ids
(``asyncrl.actors.engine.stop_tokens.model_stop_token_ids``: generation-config EOS, tokenizer EOS, chat
end-of-turn), so both end completions at the same tokens (the parity check compares them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


class ProjectReward:
    """asyncrl's reward function in TRL's calling convention: ``(prompts, completions,
    completion_ids, **columns) -> [float]``. Each sample is scored by ``score_call(fn, prompt,
    completion, fields)`` exactly as the actor scores it (a failed call scores 0.0). Keeps the
    last batch's mean reward and completion length for the step log."""

    def __init__(self, fn, field_keys: list[str]) -> None:
        self.fn, self.field_keys = fn, field_keys
        self.__name__ = getattr(fn, "__name__", "reward")  # TRL names its reward metrics by it
        self.last_mean = self.last_tokens = self.last_p95 = float("nan")

    def __call__(self, prompts, completions, completion_ids=None, **columns) -> list[float]:
        from asyncrl.actors.rewards.calls import score_call

        out = []
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            fields = {k: columns[k][i] for k in self.field_keys}
            out.append(score_call(self.fn, p, c, fields).value)
        self.last_mean = sum(out) / len(out)
        if completion_ids is not None:
            from benchmarks.vs_trl.validation import lengths_p95

            self.last_tokens = sum(map(len, completion_ids)) / len(completion_ids)
            self.last_p95 = lengths_p95([len(c) for c in completion_ids])
        return out


LOGITS_BUDGET_BYTES = 1 << 30
"""One micro-batch's float32 logits at most: TRL materialises [rows, prompt + completion, vocab];
for SmolLM2's 32 completions that is 32 x 384 x 49152 x 4 B = 2.4 GB, and with its gradient
and log-softmax the worker reached 15.7 GB and was OOM-killed on a 23 GB machine."""


def micro_batches(cfg, model_dir: str) -> int:
    """How many micro-batches (gradient accumulation) a step's completions are trained in: the
    fewest that divide them and keep a micro-batch's logits (``data.max_prompt_length +
    sampling.max_tokens`` positions) within ``LOGITS_BUDGET_BYTES``. 1 for the demo's vocabulary.
    TRL's "dapo" loss divides by the tokens of the whole generation batch, so the step's loss
    stays the token mean over all its completions (asyncrl micro-batches by tokens too)."""
    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    rows = cfg.learner.batch_groups * cfg.sampling.n_samples
    per_row = (cfg.data.max_prompt_length + cfg.sampling.max_tokens) * vocab * 4
    fits = (
        k
        for k in range(1, rows + 1)
        if rows % k == 0 and rows // k * per_row <= LOGITS_BUDGET_BYTES
    )
    return next(fits, rows)


def trl_settings(cfg, out_dir: Path, micro: int = 1) -> dict:
    """GRPOConfig keyword arguments equal to ``cfg``'s job (the reasons are in vs_trl.py),
    trained in ``micro`` micro-batches (``micro_batches``)."""
    s, lc, algo = cfg.sampling, cfg.learner, cfg.algorithm
    return dict(
        output_dir=str(out_dir / "trl_output"),
        per_device_train_batch_size=lc.batch_groups * s.n_samples // micro,
        gradient_accumulation_steps=micro,
        steps_per_generation=micro,  # one generation batch per optimizer step (on-policy)
        num_generations=s.n_samples,
        max_completion_length=s.max_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=0 if s.top_k == -1 else s.top_k,  # TRL: 0 = off; asyncrl: -1 = off
        learning_rate=lc.lr,  # the schedule itself is passed in (``build_optimizer``)
        weight_decay=lc.weight_decay,
        max_grad_norm=lc.grad_clip,
        num_iterations=algo.ppo_epochs,
        epsilon=algo.eps_low,
        epsilon_high=algo.eps_high,
        beta=algo.kl_coef,
        loss_type="dapo",  # token-mean over the step's whole batch (asyncrl: token_mean)
        scale_rewards="group" if algo.std_normalize else "none",
        importance_sampling_level="token",
        mask_truncated_completions=False,
        shuffle_dataset=False,  # cursor order, as the actor leases prompts
        max_steps=lc.steps,
        seed=cfg.task.seed if cfg.task.seed is not None else cfg.seed,
        bf16=False,  # TRL's default is bf16; the demo trains in float32
        fp16=False,
        use_cpu=lc.device == "cpu",
        gradient_checkpointing=cfg.model.gradient_checkpointing,  # TRL's default is True
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def build_optimizer(model, cfg):
    """asyncrl's optimizer and schedule (learner/trainer.py): ``AdamW(lr, weight_decay)``, the
    step of version ``v`` at ``lr * min(1, (v + 1) / warmup_steps)``. (TRL's own
    ``constant_with_warmup`` starts at 0, one step behind.)"""
    import torch

    lc = cfg.learner
    opt = torch.optim.AdamW(model.parameters(), lr=lc.lr, weight_decay=lc.weight_decay)
    warm = max(1, lc.warmup_steps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    return opt, sched


def build_trainer(cfg, model_dir: str, out_dir: Path, t0: float, min_prompts=0):
    """(trainer, step_log, prompts, reward_fn): TRL's GRPOTrainer on the job of ``cfg``; its
    dataset is the first ``max(steps x batch_groups, min_prompts)`` prompts; its callbacks log
    the steps (``out_dir/steps.jsonl``) and validate (``out_dir/val.jsonl``)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from asyncrl.actors.data.tasks import build_prompt_source
    from asyncrl.actors.engine.stop_tokens import model_stop_token_ids
    from asyncrl.actors.rewards.loading import load_reward_fn
    from benchmarks.vs_trl.validation import GreedyValidation

    source = build_prompt_source(cfg, model_dir)
    n_prompts = max(cfg.learner.steps * cfg.learner.batch_groups, min_prompts)
    prompts = [source.get(i) for i in range(n_prompts)]  # cursor order
    field_keys = sorted(prompts[0].fields)
    rows = [{"prompt": p.text, **{k: p.fields[k] for k in field_keys}} for p in prompts]
    reward_fn = load_reward_fn(cfg.task.reward_fn)
    reward = ProjectReward(reward_fn, field_keys)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    stop_ids = model_stop_token_ids(model_dir)
    model.generation_config.eos_token_id = stop_ids  # TRL's eos_token_ids: asyncrl's stops
    step_log = StepLog(out_dir / "steps.jsonl", t0, reward)
    val = GreedyValidation(cfg, model_dir, reward_fn, stop_ids, out_dir / "val.jsonl", t0)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=GRPOConfig(**trl_settings(cfg, out_dir, micro_batches(cfg, model_dir))),
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        optimizers=build_optimizer(model, cfg),
        callbacks=[step_log, val],  # in this order: a step is logged before its validation
    )
    return trainer, step_log, prompts, reward_fn


class StepLog:
    """A TRL/transformers trainer callback: one JSON line per optimizer step; ``t0`` is the
    parent's spawn time (epoch seconds). Duck-typed (transformers is imported after argument
    parsing): every other ``on_*`` event is a no-op."""

    def __init__(self, path: Path, t0: float, reward: ProjectReward) -> None:
        self.path, self.t0, self.reward = path, t0, reward
        self.train_begin = float("nan")

    def on_train_begin(self, args, state, control, **kw):
        self.train_begin = time.time()

    def on_step_end(self, args, state, control, **kw):
        now, r = time.time(), self.reward
        rec = {"step": state.global_step, "t_proc_s": now - self.t0,
               "t_train_s": now - self.train_begin, "reward": r.last_mean,
               "completion_tokens": r.last_tokens, "completion_tokens_p95": r.last_p95}  # fmt: skip
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")

    def __getattr__(self, name: str):
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.vs_trl.trl_worker", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--out", type=Path, required=True, help="where the worker's files go")
    p.add_argument("--t0", type=float, default=None, help="the parent's spawn time (epoch s)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--parity-cases", type=int, default=20)
    p.add_argument("--parity-only", action="store_true", help="check parity, do not train")
    p.add_argument("--skip-parity", action="store_true",
                   help="train without checking (the caller checked in a --parity-only run)")  # fmt: skip
    p.add_argument("overrides", nargs="*", help="asyncrl config overrides (key=value)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = args.t0 if args.t0 is not None else time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    torch.set_num_threads(args.threads)
    from asyncrl.core.config.load import load_config
    from asyncrl.orchestration.launch.preflight import resolve_model
    from benchmarks.vs_trl import parity as vs_trl_parity
    from benchmarks.vs_trl.validation import validation_of

    cfg = load_config(args.overrides)
    model_dir = resolve_model(cfg)
    for name in ("steps.jsonl", "val.jsonl"):
        (args.out / name).unlink(missing_ok=True)
    trainer, step_log, prompts, reward_fn = build_trainer(
        cfg, model_dir, args.out, t0, args.parity_cases
    )
    if not args.skip_parity:
        parity = vs_trl_parity.check(trainer, cfg, model_dir, prompts, reward_fn, args.parity_cases)
        (args.out / "parity.json").write_text(json.dumps(parity, indent=2))
        if not parity["passed"]:
            print(f"[trl_worker] PARITY FAILED: {parity['failures'][:5]}", file=sys.stderr)
            return 3
        print(f"[trl_worker] parity ok ({parity['summary']})", flush=True)
    if args.parity_only:
        return 0
    trainer.train()
    done = {"startup_s": step_log.train_begin - t0,
            "val_seconds": validation_of(trainer).seconds_total,
            "settings": trl_settings(cfg, Path("OUT"), micro_batches(cfg, model_dir)),
            "model_dir": Path(model_dir).name,
            "torch_threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "cores": sorted(os.sched_getaffinity(0)), "wall_s": time.time() - t0}  # fmt: skip
    (args.out / "done.json").write_text(json.dumps(done, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
