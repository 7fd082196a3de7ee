"""The dedicated LISTEN connection of a process that waits for PostgreSQL's notices.

``LISTEN`` is session state: it needs a connection of its own, not one from the pool (a pooled one goes
back after each statement, and PgBouncer's transaction pooling hands it to another client). The
notice hub (``oste.storage.notices``) holds one while it has waiters, through ``PostgresDialect.
listening``, and opens a new one when it is lost. It connects where the pool does (with its session
settings, and to the primary of a host list), or at the URL ``listen_through`` gave, the server itself
reached directly beside a PgBouncer; then it checks that both reach the same database.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from tortoise import connections

from oste.storage.dialects.postgres_sessions import POSTGRES_SESSION

log = logging.getLogger("oste.storage.notices")


@asynccontextmanager
async def listening(
    connection: str, direct: dict[str, Any] | None, channel: str, notified: Callable[[str], None]
) -> AsyncIterator[asyncio.Event]:
    """A LISTEN connection on ``channel`` for the block, calling ``notified`` with each payload: with
    ``direct`` (``asyncpg.connect`` arguments) when given, else where the pool of ``connection``
    connects. Yields an event set when the connection is lost; closes it when the block ends."""
    conn = None
    try:
        conn = await _connect(connection, direct)
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _conn: lost.set())
        if direct is not None:
            await _check_same_database(conn, connection)
        await conn.add_listener(channel, lambda _conn, _pid, _channel, payload: notified(payload))
        yield lost
    finally:
        if conn is not None and not conn.is_closed():
            conn.terminate()


async def _connect(connection: str, direct: dict[str, Any] | None) -> asyncpg.Connection:
    """The dedicated LISTEN connection: with ``direct`` when given, else where the pool connects."""
    if direct is not None:
        return await asyncpg.connect(**direct, server_settings=dict(POSTGRES_SESSION))
    client: Any = connections.get(connection)
    return await asyncpg.connect(
        host=client.host,
        port=client.port,
        user=client.user,
        password=client.password,
        database=client.database,
        server_settings=dict(client.server_settings or {}),
        **getattr(client, "connect_options", {}),  # a host list: only the primary LISTENs
    )


async def _check_same_database(conn: asyncpg.Connection, connection: str) -> None:
    """Warn when the LISTEN connection reaches another database than the pool's."""
    query = (
        "SELECT current_database() || ' on the server started at epoch '"
        " || extract(epoch FROM pg_postmaster_start_time())::text AS here"
    )
    listened = await conn.fetchval(query)
    pooled = (await connections.get(connection).execute_query_dict(query))[0]["here"]
    if listened != pooled:
        log.warning(
            "OSTE_LISTEN_DATABASE_URL reaches %s but OSTE_DATABASE_URL reaches %s: long-polls "
            "are not woken by changes and wait until their deadline",
            listened,
            pooled,
        )
