"""The built wheel installs one name, ``asyncrl``, with its configs inside, and works from a new
virtualenv outside the checkout: ``asyncrl run --cfg`` and a short simulated run.

The new virtualenv gets the wheel alone (``--no-deps``); its dependencies (torch, redis, ...)
come from the test's own environment through a ``.pth`` path entry, which adds that
site-packages to ``sys.path`` without running its ``.pth`` files, so the checkout's editable
install stays out of sight. Every command runs from a directory outside the checkout, and the
test checks that ``asyncrl`` was imported from the new virtualenv."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.timeout(600)]


def _run(cmd: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path, Path]:
    """``(wheel, the new virtualenv's python, a working directory outside the checkout)``."""
    root = tmp_path_factory.mktemp("wheel")
    src, out = root / "src", root / "dist"
    # a copy of the checkout's files (tracked and new, not ignored): a build in the checkout
    # would reuse whatever an earlier build left in its build/ directory
    files = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                 cwd=REPO, timeout=60).stdout.split("\0")  # fmt: skip
    for name in filter(None, files):
        source, target = REPO / name, src / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree, not yet in the index
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
    _run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
          "-q", "-w", str(out)], cwd=root, timeout=300)  # fmt: skip
    (wheel,) = out.glob("asyncrl-*.whl")
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
          str(wheel)], cwd=root, timeout=300)  # fmt: skip
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                cwd=root, timeout=60).stdout.strip()  # fmt: skip
    (Path(site) / "asyncrl_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = root / "elsewhere"
    work.mkdir()
    return wheel, python, work


def test_the_wheel_holds_one_name_with_its_configs(installed):
    wheel, _, _ = installed
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        entry_points = z.read(meta).decode()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"asyncrl"}, top
    assert "asyncrl/configs/config.yaml" in names
    assert "asyncrl/configs/model/smollm2.yaml" in names
    assert "asyncrl = asyncrl.orchestration.cli:main" in entry_points
    assert "asyncrl.actors.weights.plugin:register" in entry_points


def test_the_installed_package_prints_its_config_and_trains_a_simulated_run(installed):
    _, python, work = installed
    where = _run([str(python), "-c", "import asyncrl.learner, asyncrl.core.config.load as c; "
                  "print(asyncrl.learner.__file__); print(c.CONFIG_DIR)"],
                 cwd=work, timeout=120).stdout.split()  # fmt: skip
    venv_dir = python.parent.parent
    assert all(Path(p).is_relative_to(venv_dir) for p in where), where

    cli = python.parent / "asyncrl"
    cfg = _run([str(cli), "run", "--cfg", "learner.steps=7"], cwd=work, timeout=120).stdout
    assert "steps: 7" in cfg and "max_staleness" in cfg, cfg[-2000:]

    run_dir = work / "run"
    _run([str(cli), "run", "experiment=tiny", "actor.engine=sim", "learner.steps=2",
          "learner.batch_groups=2", "learner.checkpoint_every=0", "metrics_port=0",
          f"run_dir={run_dir}"], cwd=work, timeout=420)  # fmt: skip
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_version"] == 2, summary
