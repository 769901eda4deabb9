"""Bad input stops early with a message that names the problem and the fix."""

import pytest

from tests.e2e.conftest import run_cli


def test_unknown_config_key():
    proc = run_cli(["run", "learner.nope=3"], timeout=120)
    assert proc.returncode == 2
    assert "unknown config key 'learner.nope'" in proc.stderr


def test_bad_config_value():
    proc = run_cli(["run", "learner.lr=-1"], timeout=120)
    assert proc.returncode == 2
    assert "learner.lr must be > 0" in proc.stderr


def test_missing_model_path(tmp_path):
    proc = run_cli(
        ["run", f"model.path={tmp_path / 'nope'}", f"run_dir={tmp_path / 'run'}"], timeout=120
    )
    assert proc.returncode == 1
    assert "not a Hugging Face model directory" in proc.stderr
    assert "model.path=demo" in proc.stderr


@pytest.mark.redis
def test_unreachable_redis(tmp_path):
    url = "redis://:secretpw@127.0.0.1:1/0"
    proc = run_cli(["launch", "learner", f"buffer.url={url}", f"run_dir={tmp_path}"], timeout=120)
    assert proc.returncode == 1
    assert "127.0.0.1:1" in proc.stderr
    assert "asyncrl launch buffer" in proc.stderr, "the message should say how to get a server"
    assert "secretpw" not in proc.stderr + proc.stdout, "the password must be masked"


def test_launch_without_url(tmp_path):
    proc = run_cli(["launch", "actors", f"run_dir={tmp_path}"], timeout=120)
    assert proc.returncode == 1
    assert "needs buffer.url" in proc.stderr


def test_bad_reward_function_fails_before_anything_starts(tmp_path):
    proc = run_cli(
        ["run", "task.reward_fn=asyncrl.actors.rewards:nope", f"run_dir={tmp_path / 'run'}"],
        timeout=120,
    )
    assert proc.returncode == 1
    assert "task.reward_fn" in proc.stderr and "has no attribute 'nope'" in proc.stderr
    assert "warm" not in proc.stdout.lower(), "it should fail before the demo warm start"
    assert not (tmp_path / "run" / "redis").exists(), "no Redis should have been started"
