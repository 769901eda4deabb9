"""Config strings cannot instantiate Python objects: no ``_target_`` anywhere, and nothing
in the code calls Hydra's instantiate; ``task.reward_fn`` is the only code a config names."""

from __future__ import annotations

import ast
import json
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

from asyncrl.core.config.load import CONFIG_DIR, ConfigError, config_from_json, load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "override",
    ["+task._target_=os.system", "+_target_=subprocess.Popen", "+learner._partial_=true"],
)
def test_override_with_target_is_refused(override):
    with pytest.raises(ConfigError) as err:
        load_config([override])
    msg = str(err.value)
    key = override[1:].split("=")[0]
    assert f"'{key}' is not allowed" in msg and "task.reward_fn" in msg, msg


def test_target_in_a_yaml_file_is_refused(tmp_path):
    cdir = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, cdir)
    task = cdir / "task" / "addition.yaml"
    text = task.read_text()
    task.write_text(text + "\n_target_: os.system\n")
    with pytest.raises(ConfigError, match=r"'task\._target_' is not allowed"):
        load_config([], config_dir=cdir)
    task.write_text(text + "\nevil:\n  _target_: os.system\n  command: touch PWNED\n")
    with pytest.raises(ConfigError, match=r"'task\.evil'"):  # not in the schema either
        load_config([], config_dir=cdir)


def test_target_in_config_json_is_refused():
    """Roles read the run's config.json: the same rule applies there."""
    data = asdict(load_config([]))
    data["buffer"]["extra"] = [{"_target_": "os.system"}]
    with pytest.raises(ConfigError, match=r"'buffer\.extra\[0\]\._target_' is not allowed"):
        config_from_json(json.dumps(data))


def test_default_config_loads():
    assert load_config([]).task.reward_fn == "asyncrl.actors.data.addition:addition_reward"


def test_no_code_instantiates_objects_from_config():
    """No hydra.utils.instantiate / call / get_class / get_method / locate in our packages."""
    bad = []
    for d in ("asyncrl",):  # every part is a subpackage (actors/ etc. link into it)
        for path in (ROOT / d).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hydra"):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.Attribute):
                    names = [node.attr] if ast.unparse(node.value).endswith("hydra.utils") else []
                hits = set(names) & {"instantiate", "call", "get_class", "get_method", "get_object",
                                     "_locate", "locate"}  # fmt: skip
                if hits:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {sorted(hits)}")
    assert not bad, bad
