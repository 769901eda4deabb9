"""``asyncrl eval`` without an engine (asyncrl/orchestration/evaluate/): its command line, the
checkpoints it accepts and refuses, the result's numbers from literal records, the scoring
loop (concurrency, deadline, stop, errors) over a scripted engine and the real ``Validator``
and reward scorer, and its signal handling. tests/e2e/test_eval.py runs the command with
vLLM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

from asyncrl.actors.data.addition import AdditionSource
from asyncrl.actors.data.datafile import DataError
from asyncrl.actors.engine.vllm_engine import Completion
from asyncrl.actors.rewards.scoring import RewardErrorRate, RewardScorer
from asyncrl.actors.validation import Validator
from asyncrl.core.config.job import Config
from asyncrl.core.config.load import ConfigError, load_config
from asyncrl.learner.lora.base import base_fingerprint
from asyncrl.orchestration import cli
from asyncrl.orchestration.evaluate.args import (
    VAL_AS_TRAIN,
    default_run_dir,
    eval_overrides,
    explain_config_error,
)
from asyncrl.orchestration.evaluate.checkpoint import (
    check_lora_base,
    find_checkpoint,
    run_config_warnings,
)
from asyncrl.orchestration.evaluate.inputs import check_inputs, check_val_files
from asyncrl.orchestration.evaluate.result import Outcome, build_result, summary_lines
from asyncrl.orchestration.evaluate.scoring import score_prompts
from asyncrl.orchestration.evaluate.session import EVAL_MAX_NUM_SEQS, engine_lora, eval_batch
from asyncrl.orchestration.evaluate.stopping import StopSignals
from asyncrl.orchestration.launch import preflight
from tests.fakes.engines import Call, ScriptedEngine

# -- the command line ----------------------------------------------------------------------------


def test_val_files_stand_in_for_train_files_unless_the_command_line_sets_them():
    assert eval_overrides(["task=file"]) == ["task=file", VAL_AS_TRAIN]
    given = ["task=file", "data.train_files=[t.jsonl]"]
    assert eval_overrides(given) == given
    cfg = load_config(eval_overrides(["task=file", "data.val_files=[a.jsonl,b.jsonl]"]))
    assert cfg.data.train_files == cfg.data.val_files == ["a.jsonl", "b.jsonl"]
    assert load_config(eval_overrides([])).data.train_files == []  # the addition task


def test_a_file_task_without_val_files_is_refused_in_an_evaluations_words(capsys):
    with pytest.raises(ConfigError) as e:
        load_config(eval_overrides(["task=file"]))
    assert "data.val_files, which is empty" in explain_config_error(str(e.value))
    assert explain_config_error("other problem") == "other problem"
    assert cli._main(["eval", "task=file"]) == 2
    assert "asyncrl eval scores data.val_files, which is empty" in capsys.readouterr().err


def test_the_eval_command_parses_its_flags_and_prints_its_config(capsys):
    args = cli.build_parser().parse_args(
        ["eval", "--checkpoint", "runs/x", "--output", "o.json", "eval.n_samples=4"]
    )
    assert (args.checkpoint, args.output, args.overrides) == (
        "runs/x",
        "o.json",
        ["eval.n_samples=4"],
    )
    assert cli._main(["eval", "--cfg", "task=file", "data.val_files=[v.jsonl]"]) == 0
    out = capsys.readouterr().out
    assert "train_files:\n  - v.jsonl" in out and "val_files:\n  - v.jsonl" in out


def test_the_default_run_dir_is_a_new_eval_directory():
    assert default_run_dir("mine") == "mine"
    assert default_run_dir("").startswith("runs/eval-")


def test_the_engine_batch_holds_the_prompts_in_flight_up_to_a_cap():
    cfg = Config()
    cfg.eval.prompts_in_flight, cfg.eval.n_samples = 8, 4
    assert eval_batch(cfg) == 32
    cfg.eval.n_samples = 1024
    assert eval_batch(cfg) == EVAL_MAX_NUM_SEQS
    cfg.actor.max_num_seqs = 7
    assert eval_batch(cfg) == 7


# -- inputs ----------------------------------------------------------------------------------------


def test_the_simulator_and_missing_val_files_are_refused_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match="actor.engine=sim"):
        check_inputs(load_config(["actor.engine=sim"]), None)
    missing = tmp_path / "val.jsonl"
    cfg = load_config(eval_overrides(["task=file", f"data.val_files=[{missing}]"]))
    with pytest.raises(DataError, match=r"data\.val_files: .*val\.jsonl' does not exist"):
        check_val_files(cfg)


# -- checkpoints -----------------------------------------------------------------------------------


def _step(run, version, *, complete=True, hf=True):
    step = run / "checkpoints" / f"step_{version:06d}"
    (step / "dcp").mkdir(parents=True)
    if complete:
        (step / "COMPLETE").write_text(str(version))
    if hf:
        (step / "hf").mkdir()
        (step / "hf" / "config.json").write_text('{"vocab_size": 32}')
    return step


def test_a_checkpoint_is_named_by_its_directory_its_export_or_its_run(tmp_path):
    run = tmp_path / "run"
    _step(run, 2)
    newest = _step(run, 4)
    _step(run, 6, complete=False)  # an interrupted save is never the newest
    for text in (newest, newest / "hf", run, run / "checkpoints"):
        ckpt = find_checkpoint(str(text))
        assert (ckpt.path, ckpt.version, ckpt.hf) == (newest, 4, newest / "hf"), text


def test_checkpoints_that_cannot_be_evaluated_are_refused_with_the_fix(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        find_checkpoint(str(run))
    run.mkdir()
    with pytest.raises(FileNotFoundError, match="model=local model.path=DIR"):
        find_checkpoint(str(run))  # no checkpoints/: a model directory, or nothing
    (run / "checkpoints").mkdir()
    with pytest.raises(FileNotFoundError, match="no complete checkpoint under"):
        find_checkpoint(str(run))
    cut = _step(run, 3, complete=False)
    with pytest.raises(ValueError, match="not a complete checkpoint .*interrupted"):
        find_checkpoint(str(cut))
    _step(run, 1)
    bare = _step(run, 5, hf=False)
    with pytest.raises(FileNotFoundError) as e:
        find_checkpoint(str(run))
    text = str(e.value)
    assert f"checkpoint {bare} has no HF export" in text and "no LoRA adapters" in text
    assert f"--checkpoint {run / 'checkpoints' / 'step_000001'}" in text  # one that has it
    assert "model.lora.export_merged=true" in text  # why a LoRA run's may have no hf/


def test_a_checkpoint_alone_without_an_export_is_told_to_resume(tmp_path):
    bare = _step(tmp_path / "run", 5, hf=False)
    with pytest.raises(FileNotFoundError, match=f"learner.resume_from={bare}"):
        find_checkpoint(str(bare))


def test_a_damaged_export_is_refused(tmp_path):
    step = _step(tmp_path / "run", 2)
    manifest = {"files": {"hf/config.json": {"bytes": 999, "xxh3": "0"}}}
    (step / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"HF export of .* is damaged .*truncated"):
        find_checkpoint(str(step))


def test_a_run_trained_on_another_task_is_warned_about(tmp_path):
    run = tmp_path / "run"
    step = _step(run, 2)
    cfg = load_config([])
    assert run_config_warnings(find_checkpoint(str(step)), cfg) == []  # no config.json
    raw = {"task": {"name": "file", "reward_fn": cfg.task.reward_fn}, "data": {"val_files": []}}
    (run / "config.json").write_text(json.dumps(raw))
    (warning,) = run_config_warnings(find_checkpoint(str(step)), cfg)
    assert "task.name=file, this evaluation task.name=addition" in warning


# -- LoRA checkpoints: adapter/ without hf/ ---------------------------------------------------------


def _base(path, weights: bytes):
    """A model directory as ``base_fingerprint`` reads it: its weight files."""
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(weights)
    return path


def _lora_step(run, version, base, *, hf=False):
    """A LoRA run's checkpoint (learner/state/checkpoint.py): adapter/ in PEFT's format, the
    base's fingerprint in state.json, hf/ only when asked (``model.lora.export_merged``)."""
    step = _step(run, version, hf=hf)
    (step / "adapter").mkdir()
    (step / "adapter" / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8.0}')
    (step / "adapter" / "adapter_model.safetensors").write_bytes(b"adapters")
    (step / "state.json").write_text(json.dumps({"lora_base": base_fingerprint(base)}))
    return step


def test_a_lora_checkpoint_without_hf_is_its_adapter_on_the_base(tmp_path):
    base = _base(tmp_path / "base", b"base weights")
    run = tmp_path / "run"
    step = _lora_step(run, 3, base)
    for text in (step, step / "adapter", run, run / "checkpoints"):
        ckpt = find_checkpoint(str(text))
        assert ckpt.adapter is not None, text
        assert (ckpt.path, ckpt.version) == (step, 3)
        assert (ckpt.adapter.path, ckpt.adapter.rank, ckpt.adapter.alpha) == (
            step / "adapter",
            4,
            8.0,
        )
    merged = _lora_step(run, 6, base, hf=True)  # model.lora.export_merged=true
    ckpt = find_checkpoint(str(run))
    assert (ckpt.path, ckpt.adapter) == (merged, None)  # hf/, the merged model, preferred


def test_a_lora_checkpoint_with_a_damaged_adapter_is_refused(tmp_path):
    step = _lora_step(tmp_path / "run", 3, _base(tmp_path / "base", b"w"))
    manifest = {"files": {"adapter/adapter_model.safetensors": {"bytes": 999, "xxh3": "0"}}}
    (step / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"LoRA adapter \(adapter/\) of .* is damaged .*trunc"):
        find_checkpoint(str(step))
    (step / "adapter" / "adapter_model.safetensors").unlink()
    with pytest.raises(ValueError, match="adapter/adapter_model.safetensors is missing"):
        find_checkpoint(str(step))
    (step / "manifest.json").unlink()
    (step / "adapter" / "adapter_model.safetensors").write_bytes(b"adapters")
    (step / "adapter" / "adapter_config.json").write_text('{"lora_alpha": 8}')
    with pytest.raises(ValueError, match="adapter_config.json cannot be read .* r and lora_alpha"):
        find_checkpoint(str(step))


def test_adapters_are_refused_on_another_base_before_the_engine_starts(tmp_path, monkeypatch):
    base = _base(tmp_path / "base", b"the weights the run trained on")
    other = _base(tmp_path / "other", b"another model's weights, longer")
    ckpt = find_checkpoint(str(_lora_step(tmp_path / "run", 3, base)))
    check_lora_base(ckpt, str(base))  # the base the run trained on: accepted
    with pytest.raises(ValueError) as e:
        check_lora_base(ckpt, str(other))
    text = str(e.value)
    assert f"--checkpoint {ckpt.path} holds LoRA adapters alone" in text
    assert f"model.path ({other})" in text and f"model.path={base}" in text  # both bases
    assert "Give the model.path or model preset the run trained from" in text
    monkeypatch.setattr(preflight, "resolve_model", lambda cfg: str(other))
    with pytest.raises(ValueError, match="belong to another base model"):
        check_inputs(load_config([]), ckpt)  # the engine starts after check_inputs
    monkeypatch.setattr(preflight, "resolve_model", lambda cfg: str(base))
    assert check_inputs(load_config([]), ckpt) == str(base)  # the engine loads the base


def test_a_lora_checkpoint_that_recorded_no_base_is_not_checked(tmp_path):
    step = _lora_step(tmp_path / "run", 3, _base(tmp_path / "base", b"w"))
    (step / "state.json").write_text("{}")
    check_lora_base(find_checkpoint(str(step)), str(_base(tmp_path / "other", b"v")))


def test_the_engine_serves_the_checkpoints_adapter_as_its_version(tmp_path):
    pytest.importorskip("vllm", reason="LoRARequest is vLLM's")
    step = _lora_step(tmp_path / "run", 3, _base(tmp_path / "base", b"w"))
    options = engine_lora(find_checkpoint(str(step)))
    adapters = options.pop("adapters")
    assert options == {"lora_rank": 4, "max_loras": 1, "initial_version": 3}
    with adapters.hold() as (lora, version):  # every request: the checkpoint's adapter
        assert (lora.lora_name, lora.lora_int_id, lora.lora_path) == (
            "v3",
            4,
            str(step / "adapter"),
        )
        assert version == 3
    assert adapters.unused() == []
    adapters.close()
    assert not adapters.root.exists() and (step / "adapter" / "adapter_config.json").is_file()
    assert engine_lora(None) == {}  # a plain model: no LoRA, whatever model.lora says
    assert engine_lora(find_checkpoint(str(_step(tmp_path / "full", 2)))) == {}


# -- the result ------------------------------------------------------------------------------------


def _records():
    return {
        0: {"index": 0, "rewards": [1.0, 0.0, 0.0, 0.0], "lengths": [2, 3, 4, 5], "errors": 0,
            "extras": {}, "sample": {"prompt": "1+1=", "completion": "2", "reward": 1.0}},
        1: {"index": 1, "rewards": [0.5, 0.0, 0.0, 0.0], "lengths": [1, 1, 1, 1], "errors": 3,
            "extras": {}},
        2: {"index": 2, "rewards": [1.0, 1.0, 1.0, 0.0], "lengths": [2, 2, 2, 2], "errors": 0,
            "extras": {}},
    }  # fmt: skip


def test_the_result_holds_the_unbiased_pass_at_k_and_counts_every_error():
    cfg = Config()
    cfg.eval.n_samples = 4
    outcome = Outcome(_records(), size=5, seconds=1.5, errors_by_kind={"raised": 3})
    r = build_result(outcome, cfg, {"model": "m", "checkpoint": None, "version": 0})
    rewards = [x for p in r["per_prompt"] for x in p["rewards"]]
    assert r["reward"] == pytest.approx(sum(rewards) / len(rewards)) == pytest.approx(4.5 / 12)
    # solved (reward >= 1) 1, 0, 3 of 4: pass@1 = c/n, pass@2 = 1 - C(4-c, 2) / C(4, 2)
    assert r["pass@1"] == pytest.approx((1 / 4 + 0 + 3 / 4) / 3)
    assert r["metrics"]["pass@2"] == pytest.approx((1 - 3 / 6 + 0 + 1) / 3)
    assert r["pass@4"] == pytest.approx((1 + 0 + 1) / 3) and r["pass@4"] >= r["pass@1"]
    assert (r["prompts"], r["prompts_total"], r["complete"]) == (3, 5, False)
    assert r["reward_errors"] == 3 and r["reward_errors_by_kind"] == {"raised": 3}
    assert r["samples"] == [{"index": 0, "prompt": "1+1=", "completion": "2", "reward": 1.0}]
    assert r["temperature"] == cfg.eval.temperature
    json.dumps(r, allow_nan=False)  # a plain JSON document
    lines = summary_lines(r)
    assert lines[0].startswith("3/5 prompts (4 samples each") and "INCOMPLETE" in lines[0]
    assert "pass@4 0.6667" in lines[1]
    assert "reward errors: 3 (raised 3)" in lines[2]


def test_one_sample_is_greedy_and_an_empty_outcome_has_no_means():
    r = build_result(Outcome({}, size=2, seconds=0.0, stopped="interrupted"), Config(), {})
    assert r["temperature"] == 0.0 and r["reward"] is None and r["pass@1"] is None
    assert (r["prompts"], r["complete"], r["stopped"]) == (0, False, "interrupted")
    assert summary_lines(r)[1] == "reward errors: 0"


# -- the scoring loop ------------------------------------------------------------------------------


class CharTokenizer:
    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


class AnswerEngine(ScriptedEngine):
    """Answers each ``a+b=`` prompt with its sum (``wrong``: with "x"); after ``answer``
    calls every generation waits forever; ``fail``: raises instead. ``peak``: most calls
    generating at once."""

    def __init__(self, answer: int = 10**6, wrong: bool = False, fail: bool = False):
        super().__init__(version=7)
        self.answer, self.wrong, self.fail = answer, wrong, fail
        self.running = self.peak = 0

    async def generate(self, prompt_ids, n, max_tokens, temperature=1.0, seed=None, **options):
        self.calls.append(Call(list(prompt_ids), n, max_tokens, temperature, seed, options))
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(0.01)
            if len(self.calls) > self.answer:
                if self.fail:
                    raise RuntimeError("engine died")
                await asyncio.Event().wait()
        finally:
            self.running -= 1
        a, b = "".join(map(chr, prompt_ids)).rstrip("=").split("+")
        text = "x" if self.wrong else str(int(a) + int(b))
        ids = [ord(c) for c in text]
        return [Completion(ids, [-0.1] * len(ids), [self.version] * len(ids), "stop")] * n


def _validator(engine, size, reward="asyncrl.actors.data.addition:addition_reward", **eval_):
    cfg = load_config([f"task.reward_fn={reward}", "task.reward_executor=thread"])
    for key, value in eval_.items():
        setattr(cfg.eval, key, value)

    class Host:  # what Validator reads of an actor: a GroupMaker has the same
        pass

    from asyncrl.actors.rewards.loading import load_reward_fn

    host = Host()
    host.cfg, host.engine, host.tokenizer = cfg, engine, CharTokenizer()
    host.scorer = RewardScorer(load_reward_fn(reward), cfg.task, lambda _: None)
    return Validator(host, AdditionSource(seed=0, split="eval"), size, None), cfg


def _score(engine, size, stop=lambda: False, **kw):
    validator, cfg = _validator(engine, size, **kw)
    lines = []
    try:
        return asyncio.run(score_prompts(validator, size, 7, cfg.eval, lines.append, stop)), lines
    finally:
        validator.actor.scorer.close()


def test_every_prompt_is_scored_once_with_at_most_prompts_in_flight_at_once():
    engine = AnswerEngine()
    outcome, lines = _score(engine, 10, n_samples=3, prompts_in_flight=4, log_samples=2)
    assert sorted(outcome.records) == list(range(10)) and len(engine.calls) == 10
    assert engine.peak == 4 and not outcome.stopped
    assert all(
        r["rewards"] == [1.0] * 3 and r["off_version"] == 0 for r in outcome.records.values()
    )
    assert sorted(i for i, r in outcome.records.items() if "sample" in r) == [0, 1]
    assert "waiting for 10 prompt(s) to be scored" in lines[0]


def test_the_deadline_keeps_the_prompts_that_finished():
    engine = AnswerEngine(answer=3)
    outcome, lines = _score(engine, 6, prompts_in_flight=1, timeout_s=0.6)
    assert outcome.stopped == "timeout" and sorted(outcome.records) == [0, 1, 2]
    assert "gave up waiting for 6 prompt(s)" in lines[-1] and "eval.timeout_s" in lines[-1]


def test_a_stop_request_ends_the_scoring_at_the_next_poll():
    engine = AnswerEngine(answer=2)
    outcome, _ = _score(engine, 6, stop=lambda: len(engine.calls) > 2, prompts_in_flight=1)
    assert outcome.stopped == "interrupted" and sorted(outcome.records) == [0, 1]
    assert outcome.seconds < 5


def test_an_engine_failure_is_raised_unless_a_stop_caused_it():
    with pytest.raises(RuntimeError, match="engine died"):
        _score(AnswerEngine(answer=2, fail=True), 6, prompts_in_flight=1)
    engine = AnswerEngine(answer=2, fail=True)
    outcome, _ = _score(engine, 6, stop=lambda: len(engine.calls) > 2, prompts_in_flight=1)
    assert outcome.stopped == "interrupted"


def test_a_reward_that_raises_scores_zero_and_is_counted_until_too_many_fail():
    reward = "tests.e2e.bad_rewards:raises"
    outcome, _ = _score(AnswerEngine(), 4, reward=reward, n_samples=2)
    assert all(r["rewards"] == [0.0, 0.0] and r["errors"] == 2 for r in outcome.records.values())
    # the first 16 rewards all failed the same way (asyncrl/core/runtime/error_window.py)
    with pytest.raises(RewardErrorRate, match="failed on each of the first 16 rewards"):
        _score(AnswerEngine(), 20, reward=reward)


def test_a_sampled_evaluation_passes_the_eval_temperature_and_seeds_by_prompt():
    engine = AnswerEngine()
    validator, cfg = _validator(engine, 2, n_samples=3, temperature=0.7)
    try:
        asyncio.run(score_prompts(validator, 2, 7, cfg.eval, lambda _: None, lambda: False))
    finally:
        validator.actor.scorer.close()
    seeds = sorted(c.seed for c in engine.calls)  # Validator's per-prompt seed
    assert [(c.n, c.temperature) for c in engine.calls] == [(3, 0.7)] * 2 and seeds == [0, 1]
    outcome, _ = _score(AnswerEngine(), 1)
    assert len(outcome.records[0]["rewards"]) == 1  # one sample: greedy (temperature 0)


# -- stopping --------------------------------------------------------------------------------------


def test_a_signal_interrupts_the_engine_start_and_only_flags_the_scoring():
    before = signal.getsignal(signal.SIGTERM)
    starting = StopSignals()
    with pytest.raises(KeyboardInterrupt), starting.starting():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(2)  # the handler raises at the next bytecode
    assert starting.requested.is_set()
    assert starting._timer is not None and starting._timer.finished.is_set()  # no hard stop
    scoring = StopSignals()
    with scoring.scoring():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
    assert scoring.requested.is_set()  # and nothing was raised
    assert signal.getsignal(signal.SIGTERM) is before
