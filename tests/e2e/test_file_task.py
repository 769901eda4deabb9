"""``asyncrl run task=file`` end to end (simulated actor, real launcher, torchrun learner and
redis-server) over a verl-layout parquet file of chat prompts: the data is loaded and
length-filtered at launch with a report, the actor goes through two seeded epochs and stops
at the end of the data, and the learner ends the run cleanly when the data runs out, before
``learner.steps``, with the epoch in metrics.jsonl and summary.json."""

import json
import os
import shutil
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.e2e.conftest import REPO, asyncrl_cmd, needs_full_stack, read_metrics, read_summary

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def _verl_rows(n: int, long: int) -> list[dict]:
    rows = [
        {
            "data_source": "toy",
            "prompt": [{"role": "user", "content": f"{i}+{i}=" + ("?" * 60 if i < long else "")}],
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"index": i},
        }
        for i in range(n + long)
    ]
    return rows


# the reward sees the chat-templated prompt and every field of the record, by name
REWARD = """
def score(prompt, completion, ground_truth, data_source, extra_info, reward_model, **rest):
    assert prompt.startswith("user: ") and prompt.endswith("\\nassistant: "), prompt
    assert data_source == "toy" and reward_model["ground_truth"] == ground_truth, rest
    assert prompt == f"user: {extra_info['index']}+{extra_info['index']}=\\nassistant: "
    return float(completion.strip() == ground_truth)
"""


def test_file_task_runs_two_epochs_and_ends_when_the_data_runs_out(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("install redis-server (apt-get install -y redis-server) to run this test")
    (tmp_path / "reward.py").write_text(REWARD)
    data = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(_verl_rows(6, long=2)), data)
    run_dir = tmp_path / "run"
    args = ["run", "experiment=tiny", "actor.engine=sim", "metrics_port=0", f"run_dir={run_dir}",
            "task=file", "data=verl", f"data.train_files=[{data}]", "data.max_prompt_length=40",
            "data.epochs=2", "actor.max_inflight=2", f"task.reward_fn={tmp_path}/reward.py:score"]  # fmt: skip
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(asyncrl_cmd(*args), cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # the launcher's load report: 2 of 8 records too long, one shown
    assert "data.train_files: 8 records; dropped 2 longer than data.max_prompt_length=40" in out
    assert "6 prompts x 2 epoch(s), shuffled per epoch (seed 0)" in out
    assert "enough for at most 3 of learner.steps=4 steps" in out
    assert "[actor 0] epoch 2/2" in out and "[actor 0] no prompts left" in out
    assert "the actors have no prompts left" in out
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [0, 1, 2]  # 12 groups = 3 steps of 4, then the end
    assert records[0]["epoch"] == 0 and records[-1]["epoch"] == 1
    summary = read_summary(run_dir)
    assert summary["final_version"] == 3 and summary["data_exhausted"] is True
    assert summary["epoch"] == 1 and summary["groups_committed"] == 12
    assert summary["reward_errors"]["count"] == 0, summary["reward_errors"]
    actor = json.loads((run_dir / "actor0.json").read_text())
    assert actor["data_exhausted"] is True and actor["epoch"] == 1


def test_file_task_with_vllm_generates_from_the_chat_templated_prompts(tmp_path):
    """A real vLLM actor (``max_model_len`` = data.max_prompt_length + sampling.max_tokens =
    40 + 8) generates from the chat-templated prompts; the reward checks every sample's prompt
    text and fields, and the run ends when the data (8 prompts = 2 steps) runs out."""
    needs_full_stack()
    (tmp_path / "reward.py").write_text(REWARD)
    data = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(_verl_rows(8, long=0)), data)
    run_dir = tmp_path / "run"
    args = ["run", "experiment=tiny", "metrics_port=0", f"run_dir={run_dir}", "task=file",
            "data=verl", f"data.train_files=[{data}]", "data.max_prompt_length=40",
            f"task.reward_fn={tmp_path}/reward.py:score"]  # fmt: skip
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(asyncrl_cmd(*args), cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    summary = read_summary(run_dir)
    assert summary["final_version"] == 2 and summary["data_exhausted"] is True
    assert summary["reward_errors"]["count"] == 0, summary["reward_errors"]
