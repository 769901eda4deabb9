"""What a launcher imports before it starts any process (orchestration/launch/preflight.py
``heavy_modules``): torch only where a check may import it, since importing it cost every
``asyncrl run`` of the CI ~2 CPU-s for nothing; whatever is imported is imported with the stop
signals held (stop_signals.py ``import_heavy_modules``)."""

from __future__ import annotations

import json
import subprocess
import sys

from asyncrl.core.config.load import load_config
from asyncrl.orchestration.launch.preflight import demo_model, heavy_modules

BOTH = ("learner", "actors")


def _cfg(tmp_path, *overrides: str):
    return load_config(
        [f"run_dir={tmp_path / 'run'}", f"model.cache_dir={tmp_path / 'cache'}", *overrides]
    )


def _built_demo(cfg):
    """A demo model directory as the warm start leaves it: the real tokenizer, a config."""
    from asyncrl.orchestration.demo.tokenizer import save_tokenizer

    path = demo_model(cfg, build=False)
    path.mkdir(parents=True)
    save_tokenizer(path)
    config = {"model_type": "qwen2", "vocab_size": 64, "max_position_embeddings": 256}
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_only_the_built_demo_model_and_our_own_code_skip_torch(tmp_path):
    cfg = _cfg(tmp_path, "actor.engine=sim")
    assert heavy_modules(cfg, BOTH) == ("torch", "transformers")  # the warm start trains
    _built_demo(cfg)
    assert heavy_modules(cfg, BOTH) == ("transformers",)  # the actors' data: a tokenizer
    assert heavy_modules(cfg, ("actors",)) == ("transformers",)
    assert heavy_modules(cfg, ("learner",)) == ()
    user = _cfg(tmp_path, "actor.engine=sim", "task.reward_fn=my_reward.py:f")
    assert heavy_modules(user, BOTH) == ("torch", "transformers")  # it may import torch
    assert heavy_modules(user, ("learner",)) == ()  # a learner does not load it
    tools = _cfg(tmp_path, "actor.engine=sim", "episode.tools=[my_tools.py:calc]")
    assert heavy_modules(tools, BOTH) == ("torch", "transformers")
    other = _cfg(tmp_path, f"model.path={tmp_path / 'model'}")
    assert heavy_modules(other, ("learner",)) == ("torch", "transformers")  # AutoTokenizer


# the launcher's checks of a built demo model, in a fresh interpreter: which heavy modules
# they import beyond what heavy_modules named
PROBE = """
import sys
from asyncrl.core.config.load import load_config
from asyncrl.orchestration.launch import preflight

cfg = load_config(sys.argv[1:])
roles = ("learner", "actors")
plan, _ = preflight.check_placement(cfg, roles)
named = preflight.heavy_modules(cfg, roles)
preflight.check_inputs(cfg, roles, plan)
print(sorted(m for m in ("torch", "transformers", "vllm") if m in sys.modules and m not in named))
"""


def test_the_checks_of_a_built_demo_model_import_no_more_than_heavy_modules_names(tmp_path):
    overrides = [f"run_dir={tmp_path / 'run'}", f"model.cache_dir={tmp_path / 'cache'}"]
    _built_demo(load_config(overrides))
    args = [*overrides, "actor.engine=sim", "learner.nproc=1", "metrics_port=0"]
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout


def test_the_complete_checkpoint_reader_imports_no_torch():
    code = "import sys, asyncrl.learner.state.complete; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr
