"""Staleness control: the hard filter at consumption and the soft gate at admission.

Contract (DESIGN.md section 4): a group may be trained at learner version ``V`` only if
``V - group.version_min <= max_staleness``. The learner enforces it with
``split_by_staleness`` right before the step that would use the groups (the stale ones are
acked as ``dropped_stale``, so every drop is counted). Actors pre-filter with
``may_generate`` so they do not spend compute on groups that would arrive already stale.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from asyncrl.types import Group

T = TypeVar("T")


def _check_max_staleness(max_staleness: int) -> None:
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")


def is_fresh(group: Group, learner_version: int, max_staleness: int) -> bool:
    """True iff ``learner_version - group.version_min <= max_staleness``."""
    _check_max_staleness(max_staleness)
    return learner_version - group.version_min <= max_staleness


def split_by_staleness(
    entries: Sequence[T], learner_version: int, max_staleness: int
) -> tuple[list[T], list[T]]:
    """Partition ``entries`` into (fresh, stale), each keeping the input order.

    ``entries`` are ``Group`` objects or records with a ``.group`` (e.g. ``buffer.Entry``).
    Invariants: ``len(fresh) + len(stale) == len(entries)``; every fresh group satisfies
    ``learner_version - version_min <= max_staleness``; every stale one violates it.
    ``max_staleness = 0`` keeps exactly the groups sampled entirely at ``learner_version``
    (or newer), i.e. strictly on-policy data.
    """
    _check_max_staleness(max_staleness)
    fresh: list[T] = []
    stale: list[T] = []
    for e in entries:
        group = e if isinstance(e, Group) else e.group  # type: ignore[attr-defined]
        (fresh if learner_version - group.version_min <= max_staleness else stale).append(e)
    return fresh, stale


class AdmissionGate:
    """Whether an actor may start generating with the weights it holds.

    Invariant: with ``may_generate`` true, a group started now has ``version_min >=
    actor_weights_version >= learner_version - max_staleness``, so it is fresh at the current
    learner version. It can still turn stale if the learner advances before it is consumed;
    the hard filter (``split_by_staleness``) catches that.
    """

    @staticmethod
    def may_generate(actor_weights_version: int, learner_version: int, max_staleness: int) -> bool:
        """False iff the actor's weights are older than ``learner_version - max_staleness``.

        ``learner_version < 0`` (not yet published) always admits.
        """
        _check_max_staleness(max_staleness)
        if learner_version < 0:
            return True
        return actor_weights_version >= learner_version - max_staleness


may_generate = AdmissionGate.may_generate
