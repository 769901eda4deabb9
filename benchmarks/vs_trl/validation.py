"""Validation on the TRL side of ``benchmarks/vs_trl/run.py``, comparable with asyncrl's.

asyncrl validates weight version V (V optimizer steps done) greedily on the validation set
(``data.val_files``, file order, the first ``eval.max_prompts``): at V = 0 (``eval.at_start``),
at the first V of every ``eval.every`` interval and at the end (``eval.at_end``), each prompt
once at temperature 0 and at most ``sampling.max_tokens`` tokens, scored by the task's reward
(actors/validation.py), summarised by ``asyncrl.learner.hub.validation.summarize``. ``GreedyValidation``
is a trainer callback doing the same in the TRL process at the same steps: HF ``generate``
(greedy, left-padded batches of ``VAL_BATCH`` prompts, stopping at asyncrl's stop ids), the
same prompt token ids (``build_val_source``), the same reward through ``score_call``, the same
summary. It runs inside TRL's training, so its seconds count against TRL's wall clock as
asyncrl's validations count against asyncrl's (there they overlap training).

Each validation appends one line to ``val.jsonl``: ``step`` (= ``val/version``), ``t_proc_s``
(seconds since the parent's spawn when the figures were known), ``t_start_s`` (the same clock
when it began: the validated weights existed then), ``t_train_s`` (since TRL's
``on_train_begin``), ``val/seconds``, and ``summarize``'s ``val/pass@1``, ``val/reward``,
``val/response_length`` (mean completion tokens, stop token included), ``val/prompts``..., plus
``val/response_length_p95`` and the first ``eval.log_samples`` prompts' completions.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

VAL_BATCH = 32
"""Prompts generated at once (left-padded); greedy results do not depend on it beyond float
rounding."""


def lengths_p95(lengths: list[int]) -> float:
    """The 0.95 quantile of ``lengths`` as the asyncrl learner logs ``response_len_p95``
    (``torch.quantile``, linear interpolation); nan when empty."""
    import torch

    if not lengths:
        return float("nan")
    return float(torch.quantile(torch.tensor(lengths, dtype=torch.float64), 0.95))


def cut_at_stop(ids: list[int], stop_ids: set[int]) -> list[int]:
    """``ids`` up to and including the first stop id (vLLM keeps the stop token)."""
    for k, token in enumerate(ids):
        if token in stop_ids:
            return ids[: k + 1]
    return ids


def greedy_generate(model, prompts: list[list[int]], max_new: int, stop_ids: list[int], pad: int):
    """Greedy completions (token id lists, cut after the first stop id) of ``prompts``."""
    import torch

    out = []
    was_training = model.training
    model.eval()
    try:
        for lo in range(0, len(prompts), VAL_BATCH):
            batch = prompts[lo : lo + VAL_BATCH]
            width = max(map(len, batch))
            ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in batch])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
            with torch.no_grad():
                gen = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                     max_new_tokens=max_new, eos_token_id=stop_ids,
                                     pad_token_id=pad, top_p=None, top_k=None,
                                     temperature=None)  # fmt: skip
            out += [cut_at_stop(row[width:].tolist(), set(stop_ids)) for row in gen]
    finally:
        model.train(was_training)
    return out


def due(schedule, step: int, start: bool = False, end: bool = False) -> bool:
    """Is ``step`` validated under ``schedule`` (``cfg.eval``)? asyncrl's rule
    (learner/hub/validation.py ``Validation.due``) on a synchronous trainer: every version's
    weights exist right after its step, so "the first version at/after every N" is each
    multiple of N. (A step already validated is not validated again: the caller's check.)"""
    if (start and schedule.at_start) or (end and schedule.at_end):
        return True
    return bool(schedule.every) and step > 0 and step % schedule.every == 0


class GreedyValidation:
    """A trainer callback: asyncrl's validation schedule and figures on TRL's policy (module
    docstring). Duck-typed like ``trl_worker.StepLog``: other ``on_*`` events are no-ops."""

    def __init__(self, cfg, model_dir: str, reward_fn, stop_ids: list[int], path: Path, t0: float):
        from transformers import AutoTokenizer

        from asyncrl.actors.data.tasks import build_val_source
        from asyncrl.actors.validation import validation_size

        self.schedule, self.max_new_tokens = cfg.eval, cfg.sampling.max_tokens
        self.reward_fn, self.stop_ids = reward_fn, list(stop_ids)
        self.path, self.t0 = path, t0
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        source = build_val_source(cfg, model_dir)
        size = validation_size(cfg, source) if source is not None else 0
        self.prompts = [source.get(i) for i in range(size)]
        self.prompt_ids = [p.token_ids or self.tokenizer.encode(p.text) for p in self.prompts]
        self.done: set[int] = set()
        self.train_begin = float("nan")
        self.seconds_total = 0.0

    def _due_now(self, step: int, *, start: bool = False, end: bool = False) -> bool:
        return bool(self.prompts) and step not in self.done and due(self.schedule, step, start, end)

    def on_train_begin(self, args, state, control, model=None, **kw):
        self.train_begin = time.time()
        if self._due_now(0, start=True):
            self.validate(model, 0)

    def on_step_end(self, args, state, control, model=None, **kw):
        if self._due_now(state.global_step):
            self.validate(model, state.global_step)

    def on_train_end(self, args, state, control, model=None, **kw):
        if self._due_now(state.global_step, end=True):
            self.validate(model, state.global_step)

    def validate(self, model, step: int) -> dict:
        """Score the current policy; append and return its record."""
        from asyncrl.actors.rewards.calls import score_call
        from asyncrl.learner.hub.validation import samples_of, summarize

        start = time.time()
        pad = self.tokenizer.pad_token_id
        pad = pad if pad is not None else self.stop_ids[0]
        comps = greedy_generate(model, self.prompt_ids, self.max_new_tokens, self.stop_ids, pad)
        records = {}
        for i, (p, ids) in enumerate(zip(self.prompts, comps, strict=True)):
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            s = score_call(self.reward_fn, p.text, text, p.fields)
            records[i] = {"rewards": [s.value], "lengths": [len(ids)], "errors": int(bool(s.reason)),
                          "extras": {k: [v] for k, v in s.extras.items()},
                          "sample": {"prompt": p.text, "completion": text, "reward": s.value}}  # fmt: skip
        now = time.time()
        self.done.add(step)
        self.seconds_total += now - start
        e = self.schedule
        record = {"step": step, "val/version": float(step), "t_proc_s": now - self.t0,
                  "t_start_s": start - self.t0, "t_train_s": now - self.train_begin,
                  **summarize(list(records.values()), e.pass_threshold),
                  "val/complete": 1.0,  # every prompt, as asyncrl's complete validations
                  "val/response_length_p95": lengths_p95([len(c) for c in comps]),
                  "val/seconds": now - start,
                  "samples": samples_of(records, min(e.log_samples, len(records)))}  # fmt: skip
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"[trl_worker] validation v{step}: pass@1 {record.get('val/pass@1', float('nan')):.3f}, "
              f"{record['val/seconds']:.1f} s", flush=True)  # fmt: skip
        return record

    def __getattr__(self, name: str):
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)


def validation_of(trainer) -> GreedyValidation:
    """The trainer's ``GreedyValidation`` callback (``trl_worker.build_trainer`` adds one)."""
    return next(c for c in trainer.callback_handler.callbacks if isinstance(c, GreedyValidation))
