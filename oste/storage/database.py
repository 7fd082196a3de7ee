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


async def settle_after_bulk_load() -> str | None:
    """Do at once what PostgreSQL's autovacuum would do over time after a bulk load of activities.

    A store that grew to a million rows over weeks was vacuumed and analysed along the way; one loaded a
    moment ago was not, and autovacuum would then work through the whole table later, on the same cores
    as the engine. Returns the statement run (None on SQLite, which has no such background work).
    """
    connection = Tortoise.get_connection("default")
    if connection.capabilities.dialect != "postgres":
        return None
    statement = "VACUUM (ANALYZE) activity"
    await connection.execute_script(statement)
    return statement
