"""A run resumed with another configuration: every part's config is kept with the
version it started from; a change of what the run means is refused unless asked for."""

from __future__ import annotations

import json

import pytest

from asyncrl.core.config.load import load_config
from asyncrl.core.runtime import rundir
from asyncrl.orchestration.launch.resume_config import changes, meaningful, refusal
from asyncrl.orchestration.launch.run_info import prepare_run_dir


def _prepare(run_dir, *overrides):
    return prepare_run_dir(load_config([f"run_dir={run_dir}", *overrides]), ("learner",))


def _parts(run_dir):
    return [json.loads(p.read_text()) for p in sorted((run_dir / "config-parts").glob("*.json"))]


def test_harmless_changes_resume_and_each_part_is_kept_with_its_start(tmp_path):
    run_dir = tmp_path / "run"
    _prepare(run_dir, "learner.steps=6")
    (run_dir / "checkpoints" / "step_000006").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_000006" / "COMPLETE").write_text("6")
    _prepare(run_dir, "learner.steps=10", "logger=[console]")
    one, two = _parts(run_dir)
    assert (one["part"], one["from_version"], one["changed"]) == (1, 0, {})
    assert two["from_version"] == 6 and two["config"]["learner"]["steps"] == 10
    assert two["changed"] == {
        "learner.steps": [6, 10],
        "logger": [["console", "jsonl"], ["console"]],
    }


def test_a_change_of_meaning_is_refused_naming_it_unless_allowed(tmp_path):
    run_dir = tmp_path / "run"
    _prepare(run_dir)
    with pytest.raises(rundir.RunDirError) as refused:
        _prepare(run_dir, "algorithm=rloo", "learner.batch_groups=8")
    text = str(refused.value)
    assert "resumes a run made with another configuration (algorithm.advantage: 'grpo' -> " in text
    assert "algorithm.name: 'grpo' -> 'rloo', learner.batch_groups: 16 -> 8)" in text
    assert "allow_config_change=true" in text and len(_parts(run_dir)) == 1
    _prepare(run_dir, "algorithm=rloo", "allow_config_change=true")
    assert "algorithm.advantage" in _parts(run_dir)[-1]["changed"]


def test_which_keys_change_the_meaning():
    assert meaningful("algorithm.advantage") and meaningful("model.path") and meaningful("seed")
    assert meaningful("data.train_files") and not meaningful("data.epochs")
    assert not meaningful("learner.steps") and not meaningful("task.reward_workers")
    assert refusal(changes({"learner": {"steps": 1}}, {"learner": {"steps": 2}}), "d") is None


def _written_before_sampling_moved(run_dir):
    """Rewrite the run's config.json as a run of before 2026-11-29 wrote it: the sampling
    settings under ``actor``."""
    path = run_dir / "config.json"
    raw = json.loads(path.read_text())
    raw["actor"] |= raw.pop("sampling")
    path.write_text(json.dumps(raw))


def test_a_run_written_before_the_sampling_group_resumes_with_its_keys_moved(tmp_path):
    run_dir = tmp_path / "run"
    _prepare(run_dir, "sampling.n_samples=4")
    _written_before_sampling_moved(run_dir)
    _prepare(run_dir, "sampling.n_samples=4", "learner.steps=9")  # the same sampling: resumes
    assert _parts(run_dir)[-1]["changed"] == {"learner.steps": [400, 9]}
    with pytest.raises(rundir.RunDirError, match=r"sampling.n_samples: 4 -> 8"):
        _prepare(run_dir)  # another group size is still another experiment
    assert meaningful("sampling.stop") and meaningful("sampling.top_p")
