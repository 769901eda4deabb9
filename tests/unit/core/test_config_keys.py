"""Every config key, its type and its default (``asyncrl run`` with no overrides) against the
snapshot in tests/unit/core/config_keys.txt: a new, removed, retyped or re-defaulted key shows up
in review as a change to that file.

    python -m tests.unit.core.test_config_keys   # rewrite the snapshot after a deliberate change
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

SNAPSHOT = Path(__file__).with_name("config_keys.txt")
GROUPS = (
    "model",
    "task",
    "data",
    "sampling",
    "episode",
    "eval",
    "actor",
    "learner",
    "algorithm",
    "buffer",
)


def key_lines(obj, prefix: str = "") -> list[str]:
    """``"<dotted key>: <type> = <default>"`` for every leaf field of the config ``obj``."""
    lines = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            lines += key_lines(value, f"{prefix}{f.name}.")
        else:
            kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            lines.append(f"{prefix}{f.name}: {kind} = {value!r}")
    return lines


def current() -> str:
    from asyncrl.core.config.load import load_config

    return "\n".join(key_lines(load_config())) + "\n"


def test_the_config_keys_match_the_snapshot():
    now, then = current(), SNAPSHOT.read_text()
    if now != then:
        old, new = set(then.splitlines()), set(now.splitlines())
        diff = [f"- {x}" for x in sorted(old - new)] + [f"+ {x}" for x in sorted(new - old)]
        raise AssertionError(
            "the config's keys changed; if that is meant, run `python -m tests.unit.core."
            "test_config_keys` and commit tests/unit/core/config_keys.txt:\n" + "\n".join(diff)
        )


def test_the_snapshot_lists_every_group():
    keys = SNAPSHOT.read_text()
    for group in GROUPS:
        assert f"\n{group}." in "\n" + keys, group


if __name__ == "__main__":
    SNAPSHOT.write_text(current())
    print(f"wrote {SNAPSHOT} ({len(current().splitlines())} keys)")
