"""The start-up heap out of the garbage collector's way (``gc.freeze``).

A role imports torch, transformers and vLLM and builds its engine or model before its steady
state: ~670,000 tracked objects in an actor's process, none of which will become garbage. A
full (generation 2) collection traverses all of them, ~0.2-0.5 s on this machine's cores,
and the steady state's allocations trigger one every few seconds: 11 of them, 2.25 s, in an
actor of a 35 s demo run, each a pause of the event loop that feeds the engine. Frozen
objects sit in a permanent generation that no collection visits; objects created later are
collected as usual.

An actor follows Python's recipe for a process that forks without exec (the ``gc.freeze``
docs): ``defer_collection`` at the top of ``asyncrl.actors.main`` (the growing heap made nine full
collections during its start, 1.5 s); ``freeze_startup_heap`` right before vLLM forks its
engine processes (``actors/engine/vllm_engine.py`` ``_new_llm``: the forks never walk, nor copy page by
page, what they inherit), collection on again in them by an at-fork hook; and once more when
its engine is up. The learner collects once and freezes before its loop. Everything frozen is
unfrozen at exit. Measured: docs/architecture.md, benchmarks/README.md (startup).
"""

from __future__ import annotations

import atexit
import gc
import os

_deferred = False
_unfreeze_at_exit = False


def defer_collection() -> None:
    """No automatic collection until ``freeze_startup_heap``. Processes forked meanwhile
    (vLLM's engine core and workers, ``actor.cpu_start_method=fork``) collect as usual."""
    global _deferred
    if not _deferred:
        os.register_at_fork(after_in_child=gc.enable)
        _deferred = True
    gc.disable()


def freeze_startup_heap(collect: bool = False) -> None:
    """Move every object tracked now to the permanent generation and turn automatic
    collection on (again, after ``defer_collection``). (``gc.get_freeze_count()`` says how
    many are frozen; it walks them: ~0.25 s for an actor's million objects.)

    ``collect=True`` runs a full collection first, so garbage of the start-up is freed, not
    kept forever (a learner: a cycle could hold a tensor). Without it the call is O(1) and
    what is garbage now stays allocated: in an actor after ``defer_collection``, ~340,000
    objects and +3 MB of RSS (683 against 680 MB), where the collection would cost 0.7 s of
    its start-up (its client process holds no weights).
    """
    global _unfreeze_at_exit
    if collect:
        gc.collect()
    gc.freeze()
    gc.enable()
    if not _unfreeze_at_exit:
        # the interpreter's last collections free them as before: frozen at exit, extension
        # modules report them as leaked (nanobind, from triton: hundreds of stderr lines that
        # buried a role's last real output)
        atexit.register(gc.unfreeze)
        _unfreeze_at_exit = True
