"""Compose the Hydra config (``configs/`` + overrides) into a validated ``Config``.

No ``_target_`` instantiation and no ``eval``: YAML values become dataclass fields, and the
only code a config can name is ``task.reward_fn`` (loaded by ``actors.rewards``).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

from asyncrl.config import Config

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
    """A config could not be composed or failed validation; the message says how to fix it."""


def _register_schema() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="asyncrl_schema", node=Config)


def load_config(overrides: list[str] | None = None, config_dir: Path | None = None) -> Config:
    """Compose ``config.yaml`` with ``overrides`` (``key=value`` / ``group=option``)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    _register_schema()
    GlobalHydra.instance().clear()
    cdir = str((config_dir or CONFIG_DIR).resolve())
    try:
        with initialize_config_dir(config_dir=cdir, version_base="1.3"):
            cfg = compose(config_name="config", overrides=list(overrides or []))
        raw = OmegaConf.to_container(cfg)
        reject_targets(raw)
        # re-merge into the schema: `+key=value` appends bypass struct mode, this catches them
        checked = OmegaConf.merge(OmegaConf.structured(Config), raw)
        return OmegaConf.to_object(checked)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"{_first_line(e)}\n  (see `asyncrl run --help` and configs/)") from e
    except ValueError as e:  # dataclass __post_init__ validation
        raise ConfigError(str(e)) from e
    finally:
        GlobalHydra.instance().clear()


INSTANTIATION_KEYS = ("_target_", "_partial_", "_args_", "_recursive_", "_convert_")


def reject_targets(node: object, path: str = "") -> None:
    """Raise ``ConfigError`` if any mapping in ``node`` has a Hydra instantiation key.

    asyncrl never instantiates objects from a config (no ``hydra.utils.instantiate``); a
    ``_target_`` would be silently ignored at best, so it is refused with the reason.
    """
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}.{key}" if path else str(key)
            if key in INSTANTIATION_KEYS:
                raise ConfigError(_not_allowed(where))
            reject_targets(value, where)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            reject_targets(value, f"{path}[{i}]")


def _not_allowed(key: str) -> str:
    return (
        f"config key '{key}' is not allowed: asyncrl never instantiates Python objects from a "
        "config (no _target_). The only code a config can name is task.reward_fn "
        "('package.module:function' or 'path/to/file.py:function'); remove the key"
    )


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    m = re.search(r"Could not override '([^']+)'", text) or re.search(r"full_key: (\S+)", text)
    if m and set(re.split(r"[.\[\]]", m.group(1))) & set(INSTANTIATION_KEYS):
        return _not_allowed(m.group(1))
    if m and ("Could not override" in text or "not in" in text):
        return f"unknown config key '{m.group(1)}' (not in the schema; valid keys: asyncrl/config.py, configs/)"
    return text.splitlines()[0] if text else type(e).__name__


def config_to_json(cfg: Config) -> str:
    """The resolved config as JSON (written to ``<run_dir>/config.json``)."""
    return json.dumps(asdict(cfg), indent=2, sort_keys=True)


def config_from_json(text: str) -> Config:
    """Inverse of ``config_to_json`` (roles started by the launcher read the run's config)."""
    from omegaconf import OmegaConf

    raw = json.loads(text)
    reject_targets(raw)
    base = OmegaConf.structured(Config)
    merged = OmegaConf.merge(base, OmegaConf.create(raw))
    return OmegaConf.to_object(merged)
