"""``oste.storage.create_groups``: a key's items go one statement at a time, each statement taking every
item that arrived while the one before was in flight (at most ``most``); a conflict fails only its
offender; a cancelled caller's item is left out; what the writer raises reaches its group."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oste.errors import Conflict, Unavailable
from oste.storage.create_groups import CreateGroups


class Writer:
    """Records each group it is given; a group holding ``bad`` raises Conflict; waits on ``gate``."""

    def __init__(self, bad: set[int] | None = None, answer: bool = True) -> None:
        self.groups: list[list[int]] = []
        self.bad = bad or set()
        self.answer = answer
        self.gate = asyncio.Event()
        self.gate.set()
        self.in_flight = 0
        self.most_in_flight = 0

    async def __call__(self, group: list[int]) -> bool:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.gate.wait()
            self.groups.append(list(group))
            if self.bad & set(group):
                raise Conflict("a constraint")
            return self.answer
        finally:
            self.in_flight -= 1


async def test_items_arriving_while_a_statement_is_in_flight_go_together_in_the_next() -> None:
    groups: CreateGroups[int] = CreateGroups(most=4)
    writer = Writer()
    writer.gate.clear()
    first = asyncio.create_task(groups.write("k", 0, writer))
    await asyncio.sleep(0)  # the flusher takes item 0 alone and waits in the writer
    await asyncio.sleep(0)
    rest = [asyncio.create_task(groups.write("k", i, writer)) for i in range(1, 10)]
    await asyncio.sleep(0)
    assert groups.waiting() == 9
    writer.gate.set()
    assert await asyncio.gather(first, *rest) == [True] * 10
    assert writer.groups == [[0], [1, 2, 3, 4], [5, 6, 7, 8], [9]]
    assert writer.most_in_flight == 1  # one statement at a time per key
    assert groups.waiting() == 0


async def test_keys_do_not_wait_for_each_other() -> None:
    groups: CreateGroups[int] = CreateGroups(most=64)
    slow, fast = Writer(), Writer()
    slow.gate.clear()
    held = asyncio.create_task(groups.write("a", 1, slow))
    assert await asyncio.wait_for(groups.write("b", 2, fast), 5) is True
    assert not held.done()
    slow.gate.set()
    assert await held is True


async def test_a_conflict_fails_its_offender_alone() -> None:
    groups: CreateGroups[int] = CreateGroups(most=8)
    writer = Writer(bad={3})
    writer.gate.clear()
    tasks = [asyncio.create_task(groups.write("k", i, writer)) for i in range(6)]
    await asyncio.sleep(0)
    writer.gate.set()
    answers = await asyncio.gather(*tasks, return_exceptions=True)
    assert [isinstance(a, Conflict) for a in answers] == [False, False, False, True, False, False]
    assert writer.groups[0] == list(range(6))  # tried together first, then one by one
    assert writer.groups[1:] == [[i] for i in range(6)]


async def test_the_writers_answer_and_failure_reach_the_whole_group() -> None:
    groups: CreateGroups[int] = CreateGroups(most=8)
    refused = Writer(answer=False)
    assert await asyncio.gather(*(groups.write("k", i, refused) for i in range(3))) == [False] * 3

    async def down(group: list[int]) -> bool:
        raise Unavailable("the database is unreachable")

    answers = await asyncio.gather(*(groups.write("k", i, down) for i in range(3)), return_exceptions=True)
    assert all(isinstance(a, Unavailable) for a in answers)
    assert groups.waiting() == 0


async def test_a_caller_cancelled_before_its_statement_is_left_out() -> None:
    groups: CreateGroups[int] = CreateGroups(most=8)
    writer = Writer()
    writer.gate.clear()
    first = asyncio.create_task(groups.write("k", 0, writer))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    gone = asyncio.create_task(groups.write("k", 1, writer))
    kept = asyncio.create_task(groups.write("k", 2, writer))
    await asyncio.sleep(0)
    gone.cancel()
    writer.gate.set()
    assert await first is True and await kept is True
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert writer.groups == [[0], [2]]


@settings(max_examples=40, deadline=None)
@given(arrivals=st.lists(st.integers(0, 3), min_size=1, max_size=60), most=st.integers(1, 9))
def test_every_item_is_written_once_in_order_in_groups_of_at_most(arrivals: list[int], most: int) -> None:
    """Items arrive in waves (``arrivals``: event-loop turns between two items): each is written in
    exactly one group, in arrival order, no group exceeds ``most``, one statement at a time."""

    async def run() -> None:
        groups: CreateGroups[int] = CreateGroups(most=most)
        writer = Writer()
        tasks = []
        for index, pause in enumerate(arrivals):
            for _ in range(pause):
                await asyncio.sleep(0)
            tasks.append(asyncio.create_task(groups.write("k", index, writer)))
        assert await asyncio.gather(*tasks) == [True] * len(arrivals)
        assert [i for group in writer.groups for i in group] == list(range(len(arrivals)))
        assert all(1 <= len(group) <= most for group in writer.groups)
        assert writer.most_in_flight == 1

    asyncio.run(run())
