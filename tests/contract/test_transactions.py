"""A transaction whose entry is cancelled gives back what it took (the SQLite connection's lock, a
PostgreSQL pool connection): an engine stopping mid-claim or a client hanging up mid-request must not
wedge every later database call. Runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio

from tortoise.transactions import in_transaction

from oste.storage import models as m
from oste.storage.dialects import PostgresDialect
from oste.storage.store import Store

ENTRIES = int(PostgresDialect.url_defaults["maxsize"]) + 5
"""More cancelled entries than the pool has connections, so a leak per entry would empty it."""


async def _hold_a_transaction() -> None:
    async with in_transaction():
        await asyncio.sleep(60)


async def test_cancelled_transaction_entries_leave_the_database_usable(store: Store) -> None:
    cancelled_while_entering = 0
    for turns in range(ENTRIES * 8):
        task = asyncio.create_task(_hold_a_transaction())
        for _ in range(turns % 8 + 1):  # cancel at different points of the entry
            await asyncio.sleep(0)
        entered = task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        cancelled_while_entering += not entered

    async def still_works() -> int:
        async with in_transaction():
            return await m.Company.all().count()

    assert cancelled_while_entering > 0
    assert await asyncio.wait_for(still_works(), timeout=10) == 0
    assert await asyncio.wait_for(m.Company.all().count(), timeout=10) == 0
