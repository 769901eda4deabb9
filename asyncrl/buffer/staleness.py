"""The staleness rule, written once: the learner's filter and the actors' admission use it.

Contract (DESIGN.md section 4): a group may be trained at learner version ``V`` only if
``V - group.version_min <= max_staleness`` (``within_staleness``). Three callers, one rule:

- the learner's hard filter, ``split_by_staleness``, right before the step that would use the
  groups (the stale ones are acked as ``dropped_stale``, so every drop is counted);
- the actor's admission (actors/actor.py): it starts a group only while
  ``within_staleness(learner_version, its weights' version, max_staleness)``. A group started
  then has ``version_min >=`` the actor's weights' version, so it is fresh at the learner
  version of that moment; it can still turn stale if the learner advances before it is
  consumed, and the hard filter catches that;
- the learner's hold on weight syncs during a validation (learner/hub.py ``sync_allowed``):
  the hold ends once the actors' weights would fail their own admission.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from asyncrl.core.types import Group

T = TypeVar("T")


def staleness(learner_version: int, oldest_version: int) -> int:
    """How many versions ``oldest_version`` (a group's ``version_min``, or the weights an
    actor holds) lags behind ``learner_version``; negative if it is newer."""
    return learner_version - oldest_version


def within_staleness(learner_version: int, oldest_version: int, max_staleness: int) -> bool:
    """The rule: True iff ``learner_version - oldest_version <= max_staleness``.

    ``max_staleness = 0`` admits only data sampled entirely at ``learner_version`` (or newer):
    strictly on-policy. A learner version not yet published (``-1``) admits every version
    ``>= -1 - max_staleness``, so every real one. Raises ValueError for ``max_staleness < 0``.
    """
    _check_bound(max_staleness)
    return staleness(learner_version, oldest_version) <= max_staleness


def split_by_staleness(
    entries: Sequence[T], learner_version: int, max_staleness: int, by_newest: bool = False
) -> tuple[list[T], list[T]]:
    """Partition ``entries`` into (fresh, stale), each keeping the input order.

    ``entries`` are ``Group`` objects or records with a ``.group`` (e.g. ``buffer.Entry``).
    Invariants: ``len(fresh) + len(stale) == len(entries)``; every fresh group satisfies
    ``within_staleness(learner_version, version_min, max_staleness)``; every stale one fails it.
    ``by_newest`` (``algorithm.stale_tokens=mask``): ``version_max`` instead of
    ``version_min``, the group's newest token (its older ones are masked by the learner).
    """
    _check_bound(max_staleness)  # also with no entries
    fresh: list[T] = []
    stale: list[T] = []
    for e in entries:
        group = e if isinstance(e, Group) else e.group  # type: ignore[attr-defined]
        judged = group.version_max if by_newest else group.version_min
        ok = within_staleness(learner_version, judged, max_staleness)
        (fresh if ok else stale).append(e)
    return fresh, stale


def _check_bound(max_staleness: int) -> None:
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
