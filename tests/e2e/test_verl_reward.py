"""A verl-style reward (``compute_score(data_source, solution_str, ground_truth, extra_info)``
returning ``{"score", "acc", "pred"}``) through ``asyncrl run``: it loads as verl's, scores the
demo task through the adapter, and its ``acc`` reaches metrics.jsonl as ``reward/acc``
(actor -> Arrow payload -> learner). Real processes with the simulated engine (seconds)."""

import json
import shutil

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.redis]

SIM = ["experiment=tiny", "actor.engine=sim", "learner.nproc=1", "metrics_port=0"]
VERL_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl-style: a dict with the score, a bool accuracy and a string (ignored)."""
    acc = solution_str.strip() == str(ground_truth)
    return {"score": 1.0 if acc else 0.25, "acc": acc, "pred": solution_str[:10]}
'''


@pytest.mark.timeout(180)
def test_verl_reward_trains_and_logs_its_extras(tmp_path, roles):
    if shutil.which("redis-server") is None:
        pytest.skip("install redis-server (apt-get install -y redis-server) to run `asyncrl run`")
    reward_file, run_dir = tmp_path / "verl_reward.py", tmp_path / "run"
    reward_file.write_text(VERL_REWARD)
    proc = roles.cli(
        "run", "run", *SIM, f"task.reward_fn={reward_file}:compute_score", f"run_dir={run_dir}"
    )
    assert roles.wait(proc, 150) == 0, proc.tail()
    steps = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps, "no step was logged"
    cfg = json.loads((run_dir / "config.json").read_text())
    rows = cfg["learner"]["batch_groups"] * cfg["sampling"]["n_samples"]
    for r in steps:
        acc = r["reward/acc"]  # every sample reported acc (0 or 1): the step's mean
        assert acc * rows == pytest.approx(round(acc * rows)) and 0 <= round(acc * rows) <= rows
        assert r["reward"] == pytest.approx(0.25 + 0.75 * acc, abs=1e-6), r  # one per sample
        assert "reward/pred" not in r and "reward/score" not in r
        assert r["reward_errors"] == 0, r
