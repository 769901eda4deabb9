"""Slurm's compressed host lists, expanded: ``n[1-3,7],gpu01`` -> ``n1 n2 n3 n7 gpu01``.

The syntax of ``SLURM_JOB_NODELIST`` and ``SLURM_STEP_NODELIST`` (what ``scontrol show
hostnames`` expands): items separated by commas outside brackets; in an item, each bracket
holds comma-separated numbers and ranges ``lo-hi``, zero-padded to the width of ``lo``
(``n[08-10]`` -> ``n08 n09 n10``); several brackets in one item multiply
(``r[1-2]n[1-2]`` -> ``r1n1 r1n2 r2n1 r2n2``). Pure: no Slurm needed.
"""

from __future__ import annotations

import itertools
import re

_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_MAX_HOSTS = 100_000  # more than any cluster has: a larger range is a typo, not a node list


def expand(text: str) -> list[str]:
    """The host names of ``text``, in order. Raises ``ValueError`` saying what is wrong."""
    if not text.strip():
        raise ValueError("an empty host list")
    return [host for item in _items(text) for host in _expand_item(item)]


def _items(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"a bracket inside a bracket at character {i + 1}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"a ']' without its '[' at character {i + 1}")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError("a '[' without its ']'")
    items.append(text[start:])
    if any(not item.strip() for item in items):
        raise ValueError("an empty item (two commas in a row, or one at an end)")
    return [item.strip() for item in items]


def _expand_item(item: str) -> list[str]:
    """One item: literal text and bracket groups, every combination in order."""
    parts = re.split(r"\[([^\]]*)\]", item)  # literal, group, literal, group, ..., literal
    choices = [[p] if i % 2 == 0 else _numbers(p) for i, p in enumerate(parts)]
    return ["".join(combo) for combo in itertools.product(*choices)]


def _numbers(group: str) -> list[str]:
    """``1-3,07`` -> ``1 2 3 07``: each range zero-padded to the width of its low end."""
    out = []
    for part in group.split(","):
        m = _RANGE.fullmatch(part.strip())
        if m is None:
            raise ValueError(f"[{group}]: {part!r} is neither a number nor a range lo-hi")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"[{group}]: the range {part} runs backwards")
        if int(hi) - int(lo) >= _MAX_HOSTS:
            raise ValueError(f"[{group}]: the range {part} has more than {_MAX_HOSTS} hosts")
        out += [str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1)]
    return out
