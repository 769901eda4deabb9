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
- the learner's hold on weight syncs during a validation (learner/hub/hub.py ``sync_allowed``):
  the hold ends once the actors' weights would fail their own admission.

``admission_window`` (``buffer.admission=window``) paces the actors so that the groups they
start are read within the bound, instead of generated and then dropped as stale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Window:
    """What an actor's LEASE needs for the admission window (``ReplayBuffer.lease_many``):
    the version of the weights it holds, the bound, and the learner's groups per step."""

    weights_version: int
    max_staleness: int
    batch_groups: int


def admission_window(
    learner_version: int,
    wants: int,
    weights_version: int,
    max_staleness: int,
    batch_groups: int,
    last_version: int | None = None,
) -> int:
    """How many groups may be in the buffer's system (leased + unread) once an actor holding
    weights ``weights_version`` starts one more (``buffer.admission=window``):

        wants + min(max_staleness - lag, last_version - learner_version) * batch_groups,
        lag = max(0, learner_version - weights_version)

    ``wants``: the groups the learner still needs for the step it is reading at
    ``learner_version`` (0 while it trains; ``ReplayBuffer.set_learner_wants``).
    ``last_version``: the version the run's last step reads at (``learner.steps - 1``,
    ``ReplayBuffer.set_learner_last_version``; None: no end known). No read follows it, so no
    group is started for a step the run will not take: the run's tail generates nothing that
    it cannot train (at ``learner.steps=9`` and bound 4, 32 of ~104 generated groups were
    left over without it). The buffer's
    LEASE script computes the same number in Lua (buffer/scripts.py), atomically with the
    count; a test holds the two equal.

    The bound it proves: the learner reads the ``wants`` oldest of the system at
    ``learner_version``, then ``batch_groups`` or more (groups dropped as stale or uniform are
    read too) per version. A group admitted at position ``p <= window`` is therefore read at a
    version ``<= learner_version + ceil((p - wants) / batch_groups) <= weights_version +
    max_staleness``: fresh. Assumption: no group admitted after it is read before it. Groups
    generate concurrently and a short answer overtakes a long one, so an overtaken group can
    still turn stale; the learner's filter (``split_by_staleness``) stays the guarantee.

    ``<= 0`` (weights ``max_staleness`` or more behind while the learner trains): admit
    nothing, wait for newer weights. Never below 0. Raises ValueError for
    ``max_staleness < 0``, ``batch_groups < 1`` or ``wants < 0``.
    """
    _check_bound(max_staleness)
    if batch_groups < 1 or wants < 0:
        raise ValueError(f"need batch_groups >= 1 and wants >= 0, got {batch_groups}, {wants}")
    ahead = max_staleness - max(0, learner_version - weights_version)
    if last_version is not None:
        ahead = min(ahead, last_version - learner_version)
    return max(0, wants + ahead * batch_groups)


def _check_bound(max_staleness: int) -> None:
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
