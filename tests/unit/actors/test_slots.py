"""``asyncrl.actors.slots.Slots``: take waits for one free slot and takes every free one."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.actors.slots import Slots


def test_take_gets_every_free_slot_and_waits_when_none_is():
    async def go():
        slots = Slots(4)
        assert await slots.take() == 4 and slots.free == 0
        waiter = asyncio.create_task(slots.take())
        await asyncio.sleep(0.01)
        assert not waiter.done()  # nothing free: it waits
        slots.give()
        slots.give(2)  # given back before the waiter ran: it takes all three
        assert await asyncio.wait_for(waiter, 1.0) == 3 and slots.free == 0

    asyncio.run(go())


def test_giving_back_more_than_was_taken_is_an_error():
    async def go():
        slots = Slots(2)
        await slots.take()
        slots.give(0)
        slots.give(2)
        with pytest.raises(ValueError, match="cannot give back 1 slots: 2 of 2 free"):
            slots.give(1)

    asyncio.run(go())
    with pytest.raises(ValueError, match="at least one slot"):
        Slots(0)
