"""Compose the Hydra config (``configs/`` + overrides) into a validated ``Config``.

No ``_target_`` instantiation and no ``eval``: YAML values become dataclass fields, and the
only code a config can name is ``task.reward_fn`` (loaded by ``asyncrl.actors.rewards.loading``).
"""

from __future__ import annotations

import contextlib
import json
import re
import typing
from collections.abc import Iterator
from dataclasses import is_dataclass
from pathlib import Path

from asyncrl.core.config import env_refs
from asyncrl.core.config.job import Config
from asyncrl.core.config.network import mask_url

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


class ConfigError(ValueError):
    """A config could not be composed or failed validation; the message says how to fix it."""


def _register_schema() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="asyncrl_schema", node=Config)


def load_config(overrides: list[str] | None = None, config_dir: Path | None = None) -> Config:
    """Compose ``config.yaml`` with ``overrides`` (``key=value`` / ``group=option``)."""
    from omegaconf import OmegaConf

    overrides = list(overrides or [])
    raw = compose(overrides, config_dir)
    with _explained(overrides, config_dir):
        # re-merge into the schema: `+key=value` appends bypass struct mode, this catches them
        checked = OmegaConf.merge(OmegaConf.structured(Config), raw)
        loaded = typing.cast(Config, OmegaConf.to_object(checked))  # a structured Config's object
    return env_refs.remember(loaded, env_refs.find(raw))  # ${oc.env:..} stays out of files


def compose(overrides: list[str] | None = None, config_dir: Path | None = None) -> dict:
    """``config.yaml`` composed with ``overrides``, as nested dicts, before the schema's
    ``__post_init__`` checks run and with ``${oc.env:..}`` unresolved: what the overrides and
    the files they select give each key (``load_config`` validates it; the Slurm launch
    compares it with the packaged defaults, ``compose([])``, to see which keys a user set)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    overrides = list(overrides or [])
    _register_schema()
    GlobalHydra.instance().clear()
    if problem := override_problem(overrides):
        raise ConfigError(problem)
    cdir = str((config_dir or CONFIG_DIR).resolve())
    try:
        with _explained(overrides, config_dir), initialize_config_dir(cdir, version_base="1.3"):
            raw = OmegaConf.to_container(hydra_compose(config_name="config", overrides=overrides))
    finally:
        GlobalHydra.instance().clear()
    reject_targets(raw)
    return typing.cast(dict, raw)


@contextlib.contextmanager
def _explained(overrides: list[str], config_dir: Path | None) -> Iterator[None]:
    """Hydra's and OmegaConf's errors, and a schema check's ``ValueError``, as a
    ``ConfigError`` whose message names the key and the fix."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        yield
    except (HydraException, OmegaConfBaseException) as e:
        typed = [o.partition("=")[0].lstrip("+~") for o in overrides]
        cdir = (config_dir or CONFIG_DIR).resolve()
        message = _first_line(e, cdir, _search_path(overrides), typed)
        raise ConfigError(f"{message}\n  ({KEYS_HINT})") from e
    except ValueError as e:  # dataclass __post_init__ validation
        raise ConfigError(str(e)) from e


def override_problem(overrides: list[str]) -> str | None:
    """What is wrong with the first override Hydra cannot use as it is, in words, with how to
    write it; None if all parse. Formerly Hydra's raw words reached the user (ANTLR's
    ``LexerNoViableAltException``, ``mismatched input '(' expecting <EOF>``, ``Error merging
    override ~learner.steps``) without naming the override or the fix."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for text in overrides:
        key, _, value = text.partition("=")
        quoted = f"{key}='{value}'"
        quote = (
            f'quote the value for Hydra: {quoted} (in a shell, around it as well: "{quoted}"); '
            "unquoted, a value may not hold spaces, non-ASCII letters or any of ()[]{}=,:'\""
        )
        try:
            parsed = parser.parse_override(text)
        except HydraException as e:
            return f"the override {text!r} cannot be parsed ({str(e).splitlines()[0]}): {quote}"
        if parsed.is_delete():
            return (
                f"the override {text!r} deletes a key, and every key of the schema must have a "
                f"value: set it instead ({key.lstrip('~')}=VALUE), or leave it out for its default"
            )
        if parsed.is_sweep_override():
            return (
                f"the override {text!r} has a comma, which Hydra reads as a sweep (one run per "
                f"value) and asyncrl runs one job; for a list write {key}=[a,b], otherwise "
                f"{quote}"
            )
    return None


KEYS_HINT = (
    "`asyncrl run --cfg` prints every key with its value; `asyncrl run --help` lists the "
    "config groups and their options"
)

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


_TYPE_WORDS: dict[object, str] = {
    int: "an integer",
    float: "a number",
    bool: "true or false",
    str: "a string",
}


def _expected(key: str) -> str | None:
    """What the schema field ``key`` (``learner.steps``) holds, in words; None if ``key`` is
    not a field of a plain type."""
    hint: object = Config
    for part in key.split("."):
        if not is_dataclass(hint):
            return None
        hint = typing.get_type_hints(hint).get(part)
    if typing.get_origin(hint) is list:
        return "a list ([a,b] in an override)"
    args = typing.get_args(hint)  # (float, NoneType) for float | None
    word = _TYPE_WORDS.get(next((a for a in args if a is not type(None)), hint))
    return word and word + (" or null" if type(None) in args else "")


def _type_error(e: BaseException | None) -> str | None:
    """``learner.steps: expected an integer, got 'abc'`` when ``e`` is (or was caused by) an
    OmegaConf ValidationError on a schema field: its own text names the converter
    ("could not be converted to Integer"), and Hydra's wrapper only the override."""
    from omegaconf.errors import ValidationError

    while e is not None and not isinstance(e, ValidationError):
        e = e.__cause__ or e.__context__
    if e is None:
        return None
    expected = _expected(e.full_key) if e.full_key else None
    if expected is None:
        return None
    got = repr(e.value) if e.value is not None else "null"
    if isinstance(e.value, bool):
        got = str(e.value).lower()  # as YAML spells it
    return f"{e.full_key}: expected {expected}, got {got}"


def _search_path(overrides: list[str]) -> list[Path]:
    """The local directories of a ``hydra.searchpath=[file://DIR, ...]`` override (where a
    user keeps presets of their own)."""
    for text in overrides:
        key, _, value = text.partition("=")
        if key.lstrip("+") == "hydra.searchpath":
            items = [x.strip().strip("'\"") for x in value.strip("[]").split(",") if x.strip()]
            return [Path(x.removeprefix("file://")) for x in items if not x.startswith("pkg://")]
    return []


_GLOBAL_GROUPS = ("experiment", "layout")
"""Groups whose presets set keys anywhere in the config and that are no config key
themselves: their files start with ``# @package _global_`` (the packaged ones in configs/
do), and a key under ``experiment.`` means a file without that line. (``model`` and ``mode``
presets are global too, but ``model.`` and ``mode.`` are real keys: no such inference.)"""


def _first_line(
    e: Exception,
    config_dir: Path = CONFIG_DIR,
    extra: list[Path] | None = None,
    typed: list[str] | None = None,
) -> str:
    if wrong_type := _type_error(e):
        return wrong_type
    text = str(e).strip()
    m = re.search(r"Could not override '([^']+)'", text) or re.search(r"full_key: (\S+)", text)
    full = m.group(1) if m else ""
    group = full.split(".")[0]
    if group in _GLOBAL_GROUPS and not any(k.startswith(group + ".") for k in typed or []):
        return (
            f"the {group} preset put its keys under '{group}.' ({full}): a preset of "
            f"the {group} group sets keys anywhere in the config, so its file must start with "
            f"the line '# @package _global_' (as configs/{group}/*.yaml do); add it to your file"
        )
    if m and set(re.split(r"[.\[\]]", m.group(1))) & set(INSTANTIATION_KEYS):
        return _not_allowed(m.group(1))
    if m and m.group(1) in REMOVED_KEYS:
        return f"config key '{m.group(1)}' was removed: {REMOVED_KEYS[m.group(1)]}"
    if m and m.group(1) in MOVED_KEYS:
        return _moved(m.group(1))
    if m and (m.group(1) + ".").startswith(tuple(k + "." for k in FREE_DICTS)):
        key = next(k for k in FREE_DICTS if (m.group(1) + ".").startswith(k + "."))
        return (
            f"{key} holds keys of your own, added with '+': +{key}.NAME=VALUE or "
            f"'+{key}={{NAME: VALUE, ...}}' (Hydra refuses a new key without it)"
        )
    if m and ("Could not override" in text or "not in" in text):
        return (
            f"unknown config key '{m.group(1)}'{_did_you_mean(m.group(1), schema_keys())}"
            " (not in the schema)"
        )
    if g := re.search(r"Could not find '([^'/]+)/([^']*)'", text):
        return _unknown_option(g.group(1), g.group(2), config_dir, extra or [])
    return text.splitlines()[0] if text else type(e).__name__


FREE_DICTS = ("episode.env_kwargs", "episode.agent_kwargs")
"""Dict fields whose keys are the user's own (Hydra adds a key only with a leading '+')."""

REMOVED_KEYS = {
    "actor.gpus_per_actor": "each vLLM actor gets one GPU per tensor-parallel worker; set "
    "actor.tensor_parallel_size instead",
}
"""Keys that existed once, with what to set instead (a config written for an older version)."""

MOVED_KEYS = {
    f"actor.{name}": f"sampling.{name}"
    for name in ("n_samples", "max_tokens", "temperature", "top_p", "top_k", "stop")
}
"""Keys that moved, old -> new: the sampling settings left ``actor`` for the ``sampling`` group
that both roles read (2026-11-29). A config naming an old key is refused naming the new one;
a run directory written before is read with its keys moved (``migrate``)."""


def _moved(old: str) -> str:
    new = MOVED_KEYS[old]
    group, _, name = new.partition(".")
    return (
        f"config key '{old}' moved to '{new}' (sampling settings are one group that the actors "
        f"and the learner read): write {new}=... on the command line, or '{name}:' under "
        f"'{group}:' in a YAML file"
    )


def migrate(raw: dict) -> dict:
    """A copy of the config ``raw`` (nested dicts, as ``config.json``) with every key of
    ``MOVED_KEYS`` at its new place: a run directory written before a key moved still reads
    (a resumed run, a role started from it). A key present at both places keeps the new one."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for old, new in MOVED_KEYS.items():
        (og, ok), (ng, nk) = old.split("."), new.split(".")
        if ok in out.get(og, {}):
            value = out[og].pop(ok)
            out.setdefault(ng, {}).setdefault(nk, value)
    return out


def schema_keys(node: object = Config, prefix: str = "") -> list[str]:
    """Every dotted key of the config schema (``learner.steps``, ...), leaves only."""
    out = []
    for name, hint in typing.get_type_hints(node).items():
        key = f"{prefix}{name}"
        out += schema_keys(hint, key + ".") if is_dataclass(hint) else [key]
    return out


def _did_you_mean(word: str, choices: list[str]) -> str:
    """``"; did you mean 'learner.steps'?"`` for the nearest of ``choices``, or ``""``."""
    import difflib

    near = difflib.get_close_matches(word, choices, n=3, cutoff=0.75)
    return f"; did you mean {' or '.join(repr(x) for x in near)}?" if near else ""


def _unknown_option(
    group: str, option: str, config_dir: Path = CONFIG_DIR, extra: list[Path] | None = None
) -> str:
    """``experiment=NAME`` naming no file in ``configs/<group>/`` (nor in a
    ``hydra.searchpath`` directory's ``<group>/``): the options that exist, and where."""
    dirs = [config_dir, *(extra or [])]
    options = sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml")})
    where = f"configs/{group}/" + "".join(f", {d / group}/" for d in extra or [])
    return (
        f"{group}={option}: no such {group} preset{_did_you_mean(option, options)} "
        f"(options: {', '.join(options) or 'none'}; files in {where})"
    )


def config_to_json(cfg: Config) -> str:
    """The resolved config as JSON (written to ``<run_dir>/config.json``), without secrets:
    ``buffer.url``'s password is masked (roles get the URL through their environment), and a
    field set by a resolver (``${oc.env:VAR}``) is written as that text (env_refs.py)."""
    return json.dumps(_masked(env_refs.written(cfg)), indent=2, sort_keys=True)


def config_to_yaml(cfg: Config) -> str:
    """The resolved config as YAML (``asyncrl run --cfg``, ``<run_dir>/config.yaml``), with
    ``buffer.url``'s password masked and resolver fields as their text."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(_masked(env_refs.written(cfg))))


def _masked(raw: dict) -> dict:
    url = raw["buffer"]["url"]
    if url:
        raw["buffer"]["url"] = mask_url(url)
    return raw


def config_from_json(text: str) -> Config:
    """Inverse of ``config_to_json`` (roles started by the launcher read the run's config)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import InterpolationResolutionError

    raw = migrate(json.loads(text))
    reject_targets(raw)
    base = OmegaConf.structured(Config)
    merged = OmegaConf.merge(base, OmegaConf.create(raw))
    try:
        cfg = typing.cast(Config, OmegaConf.to_object(merged))  # resolves ${oc.env:..} here
    except InterpolationResolutionError as e:
        key = getattr(e, "full_key", "") or "a key"
        raise ConfigError(
            f"the run's config.json sets {key} from the environment ({str(e).splitlines()[0]}); "
            "set that variable for this role too (on every node group: its value is never "
            "written to a file)"
        ) from None
    return env_refs.remember(cfg, env_refs.find(raw))
