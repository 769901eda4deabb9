"""The checks every config dataclass runs in ``__post_init__``: each failure is a
``ValueError`` that starts ``invalid config:`` and names the key, the value and the fix."""

from __future__ import annotations

import math
import operator
from dataclasses import fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"invalid config: {message}")


def require_finite(cfg: DataclassInstance, group: str) -> None:
    """Refuse nan / inf / -inf in every float field of the dataclass ``cfg`` (Optional ones
    when set): no range check below catches ``inf > 0``, and a non-finite lr or timeout only
    fails later, as a NaN loss or an overflowing deadline. Call first in ``__post_init__``."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            key = f"{group}.{f.name}" if group else f.name
            require(False, f"{key}={value} is not a finite number")


OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


def bound(
    cfg: object,
    key: str,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    hint: str = "",
) -> None:
    """Require the field ``key`` (``group.field``) of ``cfg`` to be ``> gt``, ``>= ge``,
    ``< lt`` and ``<= le`` (the limits given); a null Optional field passes (null = off).
    ``hint`` says what special values mean, e.g. ``" (0 = no limit)"``."""
    value = getattr(cfg, key.rpartition(".")[2])
    if value is None:
        return
    rules = {sym: v for sym, v in ((">", gt), (">=", ge), ("<", lt), ("<=", le)) if v is not None}
    if not all(OPS[sym](value, limit) for sym, limit in rules.items()):
        want = " and ".join(f"{sym} {limit}" for sym, limit in rules.items())
        require(False, f"{key} must be {want}{hint}, got {value!r}")


def parse_indices(spec: str) -> list[int]:
    """``"0-2,5"`` -> ``[0, 1, 2, 5]`` (Linux cpu-list syntax, as cores and GPUs are given);
    ``""`` -> ``[]``. Order and repeats are kept (``"1,0,1"`` -> ``[1, 0, 1]``), so a caller
    can refuse a repeat; ValueError on a malformed or descending range."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if first < 0 or last < first:
            raise ValueError(f"bad index range {part!r} in {spec!r}")
        out.extend(range(first, last + 1))
    return out


def format_indices(indices: list[int]) -> str:
    """The inverse of ``parse_indices`` for a list without repeats: ``[0, 1, 2, 5]`` ->
    ``"0-2,5"`` (runs of consecutive indices, in the given order)."""
    parts: list[str] = []
    start = prev = None
    for i in [*indices, None]:
        if prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = i
    return ",".join(parts)


def parse_cores(spec: str) -> list[int]:
    """``"0-2,5"`` -> ``[0, 1, 2, 5]``: the distinct indices of ``spec``, sorted."""
    return sorted(set(parse_indices(spec)))


def is_core_list(spec: str) -> bool:
    try:
        return not spec or bool(parse_cores(spec))
    except ValueError:
        return False
