"""A transaction whose entry is cancelled gives back what it took (the SQLite connection's lock, a
PostgreSQL pool connection): an engine stopping mid-claim or a client hanging up mid-request must not
wedge every later database call. Runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import uuid
from datetime import UTC, datetime

from tortoise.transactions import in_transaction

from oste.storage import close_database, open_database
from oste.storage import models as m
from oste.storage.dialects import PostgresDialect
from oste.storage.store import Store
from tests.conftest import migrated

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


async def test_a_sqlite_transaction_that_reads_first_waits_for_another_writer(sqlite_url: str) -> None:
    # The API's create refreshes a cached lookup inside its transaction now and then, so it reads
    # before it writes: with a plain BEGIN, SQLite refused its write at once while another process
    # held the write lock, instead of waiting the busy timeout for it.
    await migrated(sqlite_url)
    await open_database(sqlite_url + "?busy_timeout=5000")
    other = sqlite3.connect(
        sqlite_url.removeprefix("sqlite://"), isolation_level=None, check_same_thread=False
    )
    try:
        other.execute("BEGIN EXCLUSIVE")
        released = threading.Event()

        async def read_then_write() -> int:
            async with in_transaction():
                before = await m.Company.all().count()
                now = datetime.now(UTC)
                await m.Company.create(id=uuid.uuid4(), name="after-the-wait", created_at=now, updated_at=now)
                return before

        def release() -> None:
            other.execute("ROLLBACK")
            released.set()

        task = asyncio.create_task(read_then_write())
        asyncio.get_running_loop().call_later(0.2, release)
        assert await asyncio.wait_for(task, timeout=10) == 0
        assert released.is_set(), "the write went through while another connection held the lock"
        assert await m.Company.filter(name="after-the-wait").count() == 1
    finally:
        other.close()
        await close_database()
