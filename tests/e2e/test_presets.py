"""Every algorithm preset trains end to end: `asyncrl run experiment=tiny algorithm=<preset>`
with the real CLI (redis-server, a vLLM actor, the FSDP2 learner), a few steps each.

Kept cheap: 3 steps of 2 groups, one learner rank (the ``ppo`` preset uses two, so the sharded
critic runs end to end too), and two runs at a time (a run spends most of its wall time
starting vLLM and torchrun, which overlap well). The default preset (grpo) is the one
tests/e2e/test_run.py trains. The presets differ only in the learner, so their actors use the
simulated engine (``actor.engine=sim``: random tokens, real buffer and weight sync), which
saves a vLLM engine start per run (~2 min of CI in all); ``dapo`` keeps a real vLLM actor,
because dynamic sampling needs groups whose rewards differ (random tokens almost all score 0).
"""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from asyncrl.core.config.load import CONFIG_DIR, load_config
from tests.e2e.conftest import REPO, asyncrl_cmd, needs_full_stack, read_metrics, read_summary

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.redis]

STEPS = 3
GROUPS = 2
PARALLEL = 2
RUN_TIMEOUT_S = 600
DEFAULT = "grpo"  # the preset configs/config.yaml selects: tests/e2e/test_run.py trains it
PRESETS = sorted(
    p.stem for p in (Path(CONFIG_DIR) / "algorithm").glob("*.yaml") if p.stem != DEFAULT
)
NPROC = {"ppo": 2}
ENGINE = {"dapo": "vllm"}  # the others: sim (see the module docstring)
# what every step must export (docs/algorithms.md, "Diagnostics")
DIAGNOSTICS = [
    "is_weight_mean", "is_weight_max", "is_weight_p99", "is_truncated_frac", "is_masked_frac",
    "is_ess", "clip_frac_low", "clip_frac_high", "clip_frac_dual", "approx_kl_behave", "entropy",
    "staleness_mean", "staleness_token_mean", "loss", "grad_norm", "dropped_uniform",
]  # fmt: skip


def test_the_default_preset_is_covered_by_test_run():
    assert load_config().algorithm == load_config([f"algorithm={DEFAULT}"]).algorithm


def _start(preset: str, run_dir: Path) -> subprocess.Popen:
    args = ["run", "experiment=tiny", f"algorithm={preset}", f"learner.steps={STEPS}",
            f"learner.batch_groups={GROUPS}", f"learner.nproc={NPROC.get(preset, 1)}",
            "learner.checkpoint_every=0", "metrics_port=0", f"run_dir={run_dir}",
            f"actor.engine={ENGINE.get(preset, 'sim')}"]  # fmt: skip
    log = open(run_dir.with_suffix(".log"), "w")
    return subprocess.Popen(asyncrl_cmd(*args), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[int, Path]]:
    """Run every preset, ``PARALLEL`` at a time: preset -> (exit code, run dir)."""
    needs_full_stack()
    root = tmp_path_factory.mktemp("presets")
    todo, running, done = list(PRESETS), {}, {}
    while todo or running:
        while todo and len(running) < PARALLEL:
            preset = todo.pop(0)
            running[preset] = (_start(preset, root / preset), time.monotonic())
        for preset, (proc, t0) in list(running.items()):
            if proc.poll() is None and time.monotonic() - t0 > RUN_TIMEOUT_S:
                proc.terminate()  # SIGTERM: the launcher stops its children
                proc.wait(60)
            if proc.poll() is not None:
                done[preset] = (proc.returncode, root / preset)
                del running[preset]
        time.sleep(0.5)
    return done


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_trains_and_exports_the_diagnostics(runs, preset):
    code, run_dir = runs[preset]
    assert code == 0, run_dir.with_suffix(".log").read_text()[-5000:]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["algorithm"]["name"] == preset
    summary, records = read_summary(run_dir), read_metrics(run_dir)
    assert summary["final_version"] == STEPS and [r["version"] for r in records] == [1, 2, 3]
    for r in records:
        missing = [k for k in DIAGNOSTICS if k not in r]
        assert not missing, f"{preset}: step {r['step']} lacks {missing}"
        assert 0 < r["is_ess"] <= 1 and r["loss"] == r["loss"]  # not NaN
        assert r["groups"] == GROUPS  # a full batch every step, also after dynamic sampling
    assert (run_dir / "checkpoints" / f"step_{STEPS:06d}" / "COMPLETE").is_file()
    algo = config["algorithm"]
    if algo["kl_coef"] > 0:
        assert all("kl_ref" in r for r in records)
    if algo["dynamic_sampling"]:
        # all-equal groups end in their own terminal state, not in groups_trained
        assert summary["groups_trained"] == STEPS * GROUPS
        assert summary["groups_dropped_uniform"] == records[-1]["dropped_uniform"]
    if algo["overlong_frac"] > 0:
        assert all(r["overlong_penalty_mean"] <= 0 for r in records)


def test_ppo_trains_a_sharded_critic(runs):
    code, run_dir = runs["ppo"]
    assert code == 0, run_dir.with_suffix(".log").read_text()[-5000:]
    records = read_metrics(run_dir)
    for r in records:
        assert {"value_loss", "vf_clip_frac", "value_mean", "returns_mean"} <= set(r)
        assert r["value_loss"] == r["value_loss"] and r["critic_grad_norm"] > 0
    # the value head starts at exactly zero: non-zero values mean the critic was updated
    assert any(r["value_mean"] != 0 for r in records)
    meta = (run_dir / "checkpoints" / f"step_{STEPS:06d}" / "dcp" / ".metadata").read_bytes()
    assert b"critic_model" in meta and b"critic_optim" in meta
    # that its loss falls is tested on a fixed batch: tests/unit/learner/test_step_critic.py
