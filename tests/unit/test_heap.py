"""asyncrl/heap.py: collection deferred during start-up (not in forked engine processes), then
the start-up heap frozen out of every later collection."""

from __future__ import annotations

import gc
import os

import pytest

from asyncrl.heap import defer_collection, freeze_startup_heap


@pytest.fixture
def restore_gc():
    yield
    gc.unfreeze()
    gc.enable()


def test_deferred_collection_is_off_here_on_in_a_forked_child_and_back_after_the_freeze(
    restore_gc,
):
    defer_collection()
    assert not gc.isenabled()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # vLLM's engine core, forked from an actor (actor.cpu_start_method=fork)
        os.write(write, b"1" if gc.isenabled() else b"0")
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1", "a forked child inherited the deferral"
    os.waitpid(pid, 0)
    os.close(read)
    assert not gc.isenabled()
    frozen = freeze_startup_heap()
    assert gc.isenabled()
    assert frozen == gc.get_freeze_count() > 1000  # pytest's own objects, at least


def test_a_frozen_object_is_no_longer_traversed_and_a_later_cycle_is_still_collected(
    restore_gc,
):
    class Node:
        pass

    kept = Node()
    freeze_startup_heap(collect=True)
    assert not _tracked(kept), "the frozen object is still traversed"
    late = Node()
    late.self = late  # a cycle made after the freeze
    assert _tracked(late)
    del late
    assert gc.collect() >= 1


def _tracked(obj) -> bool:
    """``obj`` is among the objects collections traverse (not the frozen ones)."""
    return any(o is obj for o in gc.get_objects())
