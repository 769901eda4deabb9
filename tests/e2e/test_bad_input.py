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
    assert "secretpw" not in proc.stderr + proc.stdout, "the password must be masked"


def test_launch_without_url(tmp_path):
    proc = run_cli(["launch", "actors", f"run_dir={tmp_path}"], timeout=120)
    assert proc.returncode == 1
    assert "needs buffer.url" in proc.stderr
