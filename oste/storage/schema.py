"""The schema's version: migrations serialised by the database, and code that refuses a schema it does not
know.

Any number of processes may start at once on one database (``oste migrate``, a deploy's pods running
``oste api`` and ``oste worker``): each takes the migration lock before it reads which migrations are
applied, so one migrates and the others wait, then find nothing left to do. The lock is the database's
own: a PostgreSQL advisory lock taken by a transaction of its own, open for the whole migration; for
SQLite an exclusive ``flock`` of a lock file beside the database file (one machine holds the file). A
process that waits says so in one log line.

A process whose code is older than the schema (the database holds a migration it does not ship: a newer
OSTE migrated it) refuses to start, naming both versions, and read-only commands (``oste status``,
``oste export``) refuse an unmigrated or older schema instead of creating or altering anything.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from oste.errors import ConfigurationError, OsteError
from oste.storage.config import direct_connection_arguments
from oste.storage.dialects import dialect_for_url

log = logging.getLogger("oste.storage")

APP = "oste"
"""The Tortoise app whose migrations OSTE ships (``oste/storage/migrations``)."""
MIGRATIONS: tuple[str, ...] = tuple(
    sorted(p.stem for p in (Path(__file__).parent / "migrations").glob("[0-9][0-9][0-9][0-9]_*.py"))
)
"""The migrations this code ships, oldest first: the last is the schema version it runs on."""
ADVISORY_LOCK_KEY = 0x6F737465_6D696772  # "ostemigr": one key for every OSTE database on a server
"""The PostgreSQL advisory lock that serialises migrations (per database: the key is scoped to it)."""
RECORDS = "tortoise_migrations"
"""The table where Tortoise records each applied migration."""


class SchemaMismatch(OsteError):
    """The database's schema is not the one this code runs on; the message says which and what to do."""

    title = "Schema mismatch"


@dataclass(frozen=True)
class SchemaVersion:
    """Which of OSTE's migrations a database holds."""

    applied: tuple[str, ...]
    """Applied migrations (none: an empty or new database)."""

    @property
    def current(self) -> str | None:
        """The newest applied migration (None: none applied)."""
        return max(self.applied) if self.applied else None

    @property
    def pending(self) -> tuple[str, ...]:
        """Migrations this code ships that the database lacks."""
        return tuple(name for name in MIGRATIONS if name not in self.applied)

    @property
    def unknown(self) -> tuple[str, ...]:
        """Migrations the database holds that this code does not ship (a newer OSTE applied them)."""
        return tuple(name for name in self.applied if name not in MIGRATIONS)

    def require_known(self, where: str) -> None:
        """Raise SchemaMismatch when a newer OSTE migrated the database."""
        if self.unknown:
            raise SchemaMismatch(
                f"the {where} is at schema version {max(self.unknown)}, newer than this OSTE's "
                f"{MIGRATIONS[-1]}: a newer OSTE migrated it. Run that version (or newer) of OSTE; "
                "this one cannot run on it and does not downgrade it"
            )

    def require_current(self, where: str) -> None:
        """Raise SchemaMismatch unless the schema is exactly this code's (for read-only commands)."""
        self.require_known(where)
        if not self.applied:
            raise SchemaMismatch(
                f"the {where} holds no OSTE schema (never migrated, or the wrong database). Check "
                "OSTE_DATABASE_URL; a new database is set up by `oste migrate` (or `oste serve`/"
                "`oste api` on start). This command changes nothing"
            )
        if self.pending:
            raise SchemaMismatch(
                f"the {where} is at schema version {self.current}, older than this OSTE's "
                f"{MIGRATIONS[-1]} ({len(self.pending)} migrations pending). Run `oste migrate` "
                "with this version first; this command changes nothing"
            )


def _postgres_credentials(url: str) -> dict[str, Any]:
    return direct_connection_arguments(url)


async def read_version(url: str) -> SchemaVersion:
    """The migrations applied to the database at ``url``, read without changing anything (a SQLite
    file that does not exist is not created)."""
    path = dialect_for_url(url).file_of(url)
    if path is not None:
        return await asyncio.to_thread(_sqlite_version, path)
    # no statement cache: a named statement could land on another server connection behind PgBouncer
    connection = await asyncpg.connect(**_postgres_credentials(url), statement_cache_size=0)
    try:
        return await _postgres_version(connection)
    finally:
        await connection.close()


def _sqlite_version(path: Path) -> SchemaVersion:
    if not path.exists():
        return SchemaVersion(())
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        found = connection.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (RECORDS,)
        ).fetchone()
        if found is None:
            return SchemaVersion(())
        rows = connection.execute(f"SELECT name FROM {RECORDS} WHERE app = ?", (APP,)).fetchall()
        return SchemaVersion(tuple(sorted(row[0] for row in rows)))
    finally:
        connection.close()


async def _postgres_version(connection: asyncpg.Connection) -> SchemaVersion:
    if await connection.fetchval("SELECT to_regclass($1)", RECORDS) is None:
        return SchemaVersion(())
    rows = await connection.fetch(f"SELECT name FROM {RECORDS} WHERE app = $1", APP)
    return SchemaVersion(tuple(sorted(row["name"] for row in rows)))


@asynccontextmanager
async def migration_lock(url: str, where: str) -> AsyncIterator[None]:
    """Hold the database's migration lock for the block (waiting, with one log line, while another
    process holds it)."""
    path = dialect_for_url(url).file_of(url)
    if path is not None:
        async with _file_lock(path, where):
            yield
        return
    connection = await asyncpg.connect(**_postgres_credentials(url), statement_cache_size=0)
    try:
        # a transaction-level lock, held by a transaction open for the whole migration: it pins one
        # server connection even through PgBouncer's transaction pooling, and ends with the session
        # however this process ends
        async with connection.transaction():
            await connection.execute("SET LOCAL idle_in_transaction_session_timeout = 0")
            if not await connection.fetchval("SELECT pg_try_advisory_xact_lock($1)", ADVISORY_LOCK_KEY):
                log.info("another process is migrating the %s; waiting for it to finish", where)
                await connection.execute("SELECT pg_advisory_xact_lock($1)", ADVISORY_LOCK_KEY)
            yield
    finally:
        await connection.close()


@asynccontextmanager
async def _file_lock(database: Path, where: str) -> AsyncIterator[None]:
    lock_path = database.with_name(database.name + ".migrate-lock")
    try:
        descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot create the migration lock file {lock_path} beside the {where}: {exc.strerror}. "
            "Check that the data directory exists and is writable"
        ) from None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another process is migrating the %s; waiting for it to finish", where)
            await asyncio.to_thread(fcntl.flock, descriptor, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)
