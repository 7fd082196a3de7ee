"""OSTE's PostgreSQL sessions let the server end what a node cut off by the network leaves behind.

A node partitioned from the database inside a transaction keeps its row locks for as long as the
server believes the client is there; the other nodes' rescues and completions that touch those rows
wait on it (seen by tests/acceptance/test_network_partition.py: a survivor stalled for minutes until
the cut node's sessions went). The server must end such a transaction by itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest
from tortoise import Tortoise
from tortoise.transactions import in_transaction

from oste.domain.clock import SystemClock
from oste.storage.database import close_database, open_database
from oste.storage.dialects.postgres_sessions import POSTGRES_SESSION
from oste.storage.store import Store
from tests.conftest import migrated
from tests.factories import make_type

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def pg(postgres_url: str) -> AsyncIterator[str]:
    await migrated(postgres_url)
    await open_database(postgres_url)
    try:
        yield postgres_url
    finally:
        await close_database()


async def test_every_session_carries_the_settings(pg: str) -> None:
    connection = Tortoise.get_connection("default")
    for name, value in POSTGRES_SESSION.items():
        [row] = await connection.execute_query_dict(f"SHOW {name}")
        assert row[name] == value, (name, row)


@pytest.mark.slow
async def test_a_transaction_left_idle_is_ended_and_its_locks_released(pg: str) -> None:
    """Lock a row and go silent inside the transaction (a node cut off there): another session gets
    the row once the server ended the silent one, within the timeout."""
    activity_type = await make_type(Store(SystemClock()), "https://receiver.invalid/{n}")
    other = await asyncpg.connect(pg)
    lock = "SELECT id FROM activity_type WHERE id = $1 FOR UPDATE NOWAIT"
    try:
        with pytest.raises(Exception, match=r"closed|idle-in-transaction"):
            async with in_transaction() as conn:
                await conn.execute_query(
                    f"SELECT id FROM activity_type WHERE id = '{activity_type.id}' FOR UPDATE"
                )
                started = time.monotonic()
                while True:  # the silent session sends nothing more; the other one tries the row
                    try:
                        assert await other.fetchval(lock, activity_type.id) == activity_type.id
                        break
                    except asyncpg.LockNotAvailableError:
                        assert time.monotonic() - started < 25, "the silent transaction kept its lock"
                        await asyncio.sleep(0.2)
                waited = time.monotonic() - started
                await conn.execute_query("SELECT 1")  # the server ended this session meanwhile
        assert 14 < waited < 20, waited
    finally:
        await other.close()


async def test_a_statement_whose_answer_does_not_come_fails_after_the_command_timeout(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer to a statement sent just before a partition may never come (TCP's retransmission
    backoff grows to minutes): the process gives up on it after ``COMMAND_TIMEOUT`` (shortened here)
    and can use the database again at once."""
    monkeypatch.setattr("oste.storage.database.COMMAND_TIMEOUT", 0.5)
    await migrated(postgres_url)
    await open_database(postgres_url)
    try:
        connection = Tortoise.get_connection("default")
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await connection.execute_query("SELECT pg_sleep(5)")
        assert time.monotonic() - started < 2
        assert await connection.execute_query_dict("SELECT 1 AS one") == [{"one": 1}]
    finally:
        await close_database()
