"""``cpu_affinity: auto``: which cores the learner and the actors of one host get (pure).

    usable cores of the launcher (sched_getaffinity)   0 1 2 3
    asyncrl run  learner 1 rank x 1 thread, 1 actor x 1 thread
                                                       L a a a
    learner.cpu_affinity=0, actor.cpu_affinity=1-3 (and the actor's vLLM bind, actor.cpu_bind)

Rules of ``split_cores``:

- The learner needs ``learner.nproc x learner.cpu_threads`` cores, the actors ``num_actors x
  actor.cpu_threads``. When both fit, the learner takes the lowest ones it needs and the
  actors every core left: the two sides never share a core, so neither starves the other
  (a side that is idle does not lend its core either; on the demo that trade is measured in
  ``benchmarks/demo/defaults.py``: pinned 1.65x unpinned).
- When they do not fit, both sides run unpinned and the note says why.
- One side given explicitly (a core list, or '' = unpinned): the other side's ``auto`` takes
  the usable cores the explicit list leaves (all of them when it is ''), never a core of it.
- Only a command that starts both sides on this host splits (``asyncrl run``); a command that
  starts one side (``asyncrl launch learner|actors``) leaves ``auto`` unpinned: its role has
  the node's cores to itself.

``resolve`` writes the decision into the config before the run directory's ``config.json`` is
written, so the roles read plain core lists (or '') and never ``auto``.
"""

from __future__ import annotations

from asyncrl.core.config.checks import format_indices, parse_cores

AUTO = "auto"


def split_cores(usable: list[int], learner_n: int, actor_n: int) -> tuple[str, str] | None:
    """(learner cores, actor cores) as core lists, or None when ``learner_n + actor_n``
    exceed ``usable``. Invariant: the two lists are disjoint and cover ``usable``."""
    cores = sorted(usable)
    if learner_n < 1 or actor_n < 1 or learner_n + actor_n > len(cores):
        return None
    return format_indices(cores[:learner_n]), format_indices(cores[learner_n:])


def resolve(cfg, usable: list[int], both_sides: bool) -> str:
    """Replace ``auto`` in ``learner.cpu_affinity`` / ``actor.cpu_affinity`` (in place) and
    return a note for the launcher's log ('' when neither key is ``auto``). Raises ValueError
    when ``actor.engine_cpus`` does not fit the actors' cores so decided."""
    note = _resolve(cfg, usable, both_sides)
    check_engine_cpus(cfg.actor)
    return note


def check_engine_cpus(ac) -> None:
    """``actor.engine_cpus`` are some of the actors' cores and leave them at least one (an
    unpinned actor is checked when its engine starts: actors/engine/cpu_layout.py)."""
    if not ac.engine_cpus or not ac.cpu_affinity:
        return
    engine, actor = set(parse_cores(ac.engine_cpus)), set(parse_cores(ac.cpu_affinity))
    if not engine <= actor or not actor - engine:
        raise ValueError(
            f"actor.engine_cpus={ac.engine_cpus} must be some of the actors' cores "
            f"({ac.cpu_affinity}) and leave the actor's own process at least one: give the "
            "actors more cores (actor.cpu_affinity, learner.cpu_affinity) or set "
            "actor.engine_cpus='' to let the engine share them"
        )


def _resolve(cfg, usable: list[int], both_sides: bool) -> str:
    lc, ac = cfg.learner, cfg.actor
    if AUTO not in (lc.cpu_affinity, ac.cpu_affinity):
        return ""
    if lc.cpu_affinity != AUTO or ac.cpu_affinity != AUTO:
        return _resolve_one_side(cfg, usable, both_sides)
    learner_n, actor_n = lc.nproc * lc.cpu_threads, ac.num_actors * ac.cpu_threads
    split = split_cores(usable, learner_n, actor_n) if both_sides else None
    if split is None:
        why = (
            f"{len(usable)} usable core(s) for {learner_n} learner + {actor_n} actor thread(s)"
            if both_sides
            else "this command starts one side, which has the cores to itself"
        )
        split, note = ("", ""), f"cpu_affinity=auto: unpinned ({why})"
    else:
        note = f"cpu_affinity=auto: learner on cores {split[0]}, actors on cores {split[1]}"
    if lc.cpu_affinity == AUTO:
        lc.cpu_affinity = split[0]
    if ac.cpu_affinity == AUTO:
        ac.cpu_affinity = split[1]
        if not ac.cpu_bind:
            ac.cpu_bind = split[1]  # vLLM re-pins its OMP threads: keep them inside ('' = auto)
    return note


def _resolve_one_side(cfg, usable: list[int], both_sides: bool) -> str:
    """One key is ``auto``, the other explicit: ``auto`` gets the usable cores the explicit
    list leaves (unpinned when none are left, or when this command starts one side)."""
    lc, ac = cfg.learner, cfg.actor
    explicit = ac.cpu_affinity if lc.cpu_affinity == AUTO else lc.cpu_affinity
    left = [c for c in usable if c not in set(parse_cores(explicit))] if both_sides else []
    cores = format_indices(sorted(left)) if left else ""
    side = "learner" if lc.cpu_affinity == AUTO else "actors"
    if side == "learner":
        lc.cpu_affinity = cores
    else:
        ac.cpu_affinity = cores
        if not ac.cpu_bind:
            ac.cpu_bind = cores
    return f"cpu_affinity=auto: {side} on " + (f"cores {cores}" if cores else "any core (unpinned)")
