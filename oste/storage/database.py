"""Opening, migrating and closing the database."""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

from tortoise import Tortoise
from tortoise.backends.base import executor
from tortoise.exceptions import DBConnectionError, OperationalError
from tortoise.migrations.api import migrate as run_migrations

from oste.errors import Unavailable
from oste.storage.config import normalise_url, tortoise_config

log = logging.getLogger("oste.storage")


def describe(url: str) -> str:
    """The database URL without credentials, for logs and messages."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        return f"SQLite file {parts.path}"
    host = parts.hostname or "localhost"
    return f"PostgreSQL {host}:{parts.port or 5432}{parts.path}"


async def migrate(url: str) -> None:
    """Apply every pending migration to the database at ``url`` (upgrades in place; idempotent)."""
    executor.EXECUTOR_CACHE.clear()
    try:
        await run_migrations(config=tortoise_config(url))
    except (OSError, DBConnectionError, OperationalError) as exc:
        raise Unavailable(
            f"cannot migrate the {describe(url)}: {exc}. Is the database running and reachable?"
        ) from None
    finally:
        await Tortoise.close_connections()


async def open_database(url: str, apply_migrations: bool = True) -> None:
    """Migrate (unless told not to) and connect the ORM for this process."""
    if apply_migrations:
        await migrate(url)
    executor.EXECUTOR_CACHE.clear()
    try:
        await Tortoise.init(config=tortoise_config(url), _enable_global_fallback=True)
    except (OSError, DBConnectionError) as exc:
        raise Unavailable(
            f"cannot open the {describe(url)}: {exc}. Is the database running and reachable?"
        ) from None
    log.info("database ready: %s", describe(normalise_url(url)))


async def close_database() -> None:
    """Close every connection (an unclosed aiosqlite thread would hang process exit)."""
    await Tortoise.close_connections()
    await asyncio.sleep(0)


async def settle_after_bulk_load() -> str:
    """Do at once what the database would have done in the background while a store grew to the size
    of a bulk load, so what is measured next is its steady state, not the load's aftermath.

    PostgreSQL: a table that grew to a million rows over weeks was vacuumed and analysed by autovacuum
    along the way; one loaded a moment ago was not, and autovacuum would work through all of it later,
    on the same cores as the engine. SQLite: the write-ahead log holds the whole load until a checkpoint
    copies it into the database file, which the next writer would otherwise do. Returns what was run.
    """
    connection = Tortoise.get_connection("default")
    if connection.capabilities.dialect == "postgres":
        statement = "VACUUM (ANALYZE) activity"
    else:
        statement = "PRAGMA wal_checkpoint(TRUNCATE)"
    await connection.execute_script(statement)
    return statement
