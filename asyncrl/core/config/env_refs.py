"""Values a config takes from the environment (``${oc.env:VAR}``), kept out of what is written.

OmegaConf's resolvers work in every asyncrl config: ``experiment_name: ${oc.env:USER}`` or
``project_name: ${oc.env:TEAM,asyncrl}`` (a default after the comma) resolve when the config
loads. Formerly the resolved value, a token included, went into ``config.json``,
``config.yaml`` and the experiment trackers. Now every field whose text holds a resolver
(``${oc.`` ...) is remembered with that text (``remember``), and ``written`` gives the config
with the text instead of the value: the roles, which read ``config.json``, resolve it again
from their own environment (so a secret reaches a role through its environment, never
through a file), and a tracker shows ``${oc.env:VAR}``.
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
    """``cfg`` with ``refs`` attached (an attribute: not a config field); returns ``cfg``."""
    object.__setattr__(cfg, _ATTR, dict(refs))
    return cfg


def refs_of(cfg: Any) -> dict[str, str]:
    return dict(getattr(cfg, _ATTR, {}))


def written(cfg: Any) -> dict:
    """``asdict(cfg)`` with each remembered field back to its resolver text (what files and
    trackers get)."""
    raw = asdict(cfg)
    for dotted, text in refs_of(cfg).items():
        node: Any = raw
        *path, last = dotted.split(".")
        for part in path:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(last)] = text
        else:
            node[last] = text
    return raw
