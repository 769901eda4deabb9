"""Values a config takes from the environment (``${oc.env:VAR}``), kept out of what is written.

OmegaConf's resolvers work in every asyncrl config: ``experiment_name: ${oc.env:USER}`` or
``project_name: ${oc.env:TEAM,asyncrl}`` (a default after the comma) resolve when the config
loads. Formerly the resolved value, a token included, went into ``config.json``,
``config.yaml`` and the experiment trackers. Now every field whose text holds a resolver
(``${oc.`` ...) is remembered with that text (``remember``), and ``written`` gives the config
with the text instead of the value: the roles, which read ``config.json``, resolve it again
from their own environment (so a secret reaches a role through its environment, never
through a file), and a tracker shows ``${oc.env:VAR}``. A role whose environment lacks the
variable fails naming the key and the variable (``load.config_from_json``). Not checked: a
resumed run compares such a field as its text, so a variable changed between the parts of a
run is not noticed (``allow_config_change``'s check sees the same text).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

RESOLVER_MARK = "${oc."
"""The text of an OmegaConf resolver call (``${oc.env:...}``, ``${oc.decode:...}``)."""

_ATTR = "_env_refs"


def find(raw: Any, prefix: str = "") -> dict[str, str]:
    """``{"dotted.key": "${oc.env:VAR}"}`` for each string of the unresolved config ``raw``
    (nested dicts and lists) that calls a resolver."""
    out: dict[str, str] = {}
    if isinstance(raw, dict):
        for key, value in raw.items():
            out |= find(value, f"{prefix}{key}.")
    elif isinstance(raw, list):
        for i, value in enumerate(raw):
            out |= find(value, f"{prefix}{i}.")
    elif isinstance(raw, str) and RESOLVER_MARK in raw:
        out[prefix[:-1]] = raw
    return out


def remember(cfg: Any, refs: dict[str, str]) -> Any:
    """``cfg`` with ``refs`` attached, each with the value it resolved to (an attribute: not a
    config field); returns ``cfg``."""
    raw = asdict(cfg)
    resolved = {key: (text, _get(raw, key)) for key, text in refs.items()}
    object.__setattr__(cfg, _ATTR, resolved)
    return cfg


def refs_of(cfg: Any) -> dict[str, str]:
    return {key: text for key, (text, _) in getattr(cfg, _ATTR, {}).items()}


def written(cfg: Any) -> dict:
    """``asdict(cfg)`` with each remembered field back to its resolver text (what files and
    trackers get), unless the field was changed since it resolved (the launcher naming the
    experiment after the run directory): then its new value is written."""
    raw = asdict(cfg)
    for dotted, (text, value) in getattr(cfg, _ATTR, {}).items():
        if _get(raw, dotted) == value:
            _set(raw, dotted, text)
    return raw


def _get(raw: Any, dotted: str) -> Any:
    node = raw
    for part in dotted.split("."):
        node = node[int(part)] if isinstance(node, list) else node.get(part)
        if node is None:
            return None
    return node


def _set(raw: Any, dotted: str, value: Any) -> None:
    *path, last = dotted.split(".")
    node = raw
    for part in path:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
