"""Transactions that give back what they took when they fail to begin.

Tortoise's transaction contexts take a resource in ``__aenter__`` before they issue ``BEGIN``: the
SQLite context takes the connection's lock, the pooled PostgreSQL context takes a connection from the
pool. When ``BEGIN`` fails or the task is cancelled while it runs (an engine stopping, a client that
hung up), ``__aexit__`` is never called and the resource is never given back: on SQLite every later
database call of the process waits on the lock forever; on PostgreSQL the pool loses a connection
each time, until it has none. Each dialect's ``guard_transactions`` wraps its context's ``__aenter__``
(``guard_sqlite_entry``, ``guard_pooled_entry``) so that a failed entry rolls back, gives the resource
back and re-raises.

A SQLite transaction begins ``IMMEDIATE``: it takes the database's write lock at once, waiting up to
the busy timeout for another writer (another process, ``oste backup``'s probe, an operator's shell).
Tortoise's plain ``BEGIN`` takes it at the first write instead, and a transaction that read first (a
cached lookup refreshed inside it) is then refused at once: SQLite never waits for a lock a reading
transaction asks for, since the holder might be waiting for it in turn.
"""

from __future__ import annotations

import contextlib
from typing import Any

from tortoise.backends.base.client import TransactionContextPooled
from tortoise.backends.sqlite.client import SqliteTransactionContext
from tortoise.connection import get_connections


def guard_sqlite_entry() -> None:
    """Make the SQLite transaction context give back its lock when entering it fails, and begin
    ``IMMEDIATE`` (idempotent; ``SqliteDialect.guard_transactions``)."""
    SqliteTransactionContext.__aenter__ = _enter_sqlite  # type: ignore[method-assign]  # patched on purpose


def guard_pooled_entry() -> None:
    """Make the pooled (PostgreSQL) transaction context give back its connection when entering it fails
    (idempotent; ``PostgresDialect.guard_transactions``)."""
    TransactionContextPooled.__aenter__ = _enter_pooled  # type: ignore[method-assign]  # patched on purpose


async def _enter_sqlite(self: SqliteTransactionContext) -> Any:
    """Tortoise's entry, with the lock given back if anything after taking it fails."""
    await self._trxlock.acquire()
    try:
        await self.ensure_connection()
        self.token = get_connections().set(self.connection_name, self.connection)
        await _begin_immediate(self.connection)
    except BaseException:
        try:
            # aiosqlite runs statements in order on its thread: a BEGIN still running is undone here.
            if self.connection._connection is not None:
                with contextlib.suppress(Exception):
                    await self.connection._connection.rollback()
        finally:
            _reset_context_variable(self)
            self._trxlock.release()
        raise
    return self.connection


async def _begin_immediate(wrapper: Any) -> None:
    """Tortoise's ``begin`` with the write lock taken at once (see the module's note)."""
    connection = wrapper._connection
    await connection.commit()  # what Tortoise does first: ends an implicit transaction left open
    await connection.execute("BEGIN IMMEDIATE")


async def _enter_pooled(self: TransactionContextPooled) -> Any:
    """Tortoise's entry, with the pool's connection given back if beginning the transaction fails."""
    await self.ensure_connection()
    pool = self.client._parent._pool
    self.client._connection = await pool.acquire()
    try:
        self.token = get_connections().set(self.connection_name, self.client)
        await self.client.begin()
    except BaseException:
        _reset_context_variable(self)
        # asyncpg's release rolls back an open transaction and closes a connection that broke.
        with contextlib.suppress(Exception):
            await pool.release(self.client._connection)
        raise
    return self.client


def _reset_context_variable(context: Any) -> None:
    token = getattr(context, "token", None)
    if token is not None:
        with contextlib.suppress(ValueError, LookupError):
            get_connections().reset(token)
