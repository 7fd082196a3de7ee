"""A clock reading that took long is not trusted: after a network partition heals, the reading that
waited it out once shifted a node's clock by half the wait (2.9 s seen by
tests/acceptance/test_network_partition.py), so the node would have fired that much early."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import pytest

from oste.domain.clock import CorrectedClock, SystemClock
from oste.engine.clocksync import MAX_ROUND_TRIP, ClockSync
from oste.storage.dispatch import DispatchStore
from oste.storage.store import Store

pytestmark = pytest.mark.timeout(30)


class StalledDispatch(DispatchStore):
    """The real store; its clock reading waits ``stall`` seconds first, as if the request sat in a
    partitioned network and went through when it healed (the database reads its clock at the end)."""

    stall = 0.0

    async def database_time(self) -> datetime:
        await asyncio.sleep(self.stall)
        return await super().database_time()


async def test_a_slow_reading_keeps_the_offset_measured_before(store: Store) -> None:
    clock = CorrectedClock(SystemClock())
    dispatch = StalledDispatch(clock)
    sync = ClockSync(clock, dispatch)
    first = await sync.run_once()
    assert first.used and abs(first.offset) < 0.2
    dispatch.stall = 4 * MAX_ROUND_TRIP
    late = await sync.run_once()
    assert not late.used and late.round_trip >= 4 * MAX_ROUND_TRIP
    assert abs(clock.now() - SystemClock().now()) < timedelta(seconds=0.2), clock.offset
    dispatch.stall = 0.0
    assert (await sync.run_once()).used


async def test_the_first_reading_is_used_however_slow(store: Store) -> None:
    clock = CorrectedClock(SystemClock())
    dispatch = StalledDispatch(clock)
    dispatch.stall = 2 * MAX_ROUND_TRIP
    first = await ClockSync(clock, dispatch).run_once()
    assert first.used  # a node starts on the database's time, within half the round trip
    assert abs(first.offset) <= first.round_trip / 2 + 0.2
