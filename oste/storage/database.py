"""Opening, migrating and closing the database, and telling an outage from any other storage error."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from tortoise import Tortoise
from tortoise.backends.base import executor
from tortoise.exceptions import BaseORMException, DBConnectionError
from tortoise.migrations.api import migrate as run_migrations

from oste.errors import OsteError, Unavailable
from oste.storage.config import COMMAND_TIMEOUT, normalise_url, tortoise_config
from oste.storage.dialects import (
    DRIVER_ERRORS,
    DRIVER_LOGGERS,
    RECONNECT,
    Dialect,
    dialect_for_url,
    dialect_of,
    driver_outage,
    forget_open,
    record_open,
)
from oste.storage.schema import SchemaVersion, migration_lock, read_version

log = logging.getLogger("oste.storage")


class MigrationFailed(OsteError):
    """A migration failed for another reason than an outage; the message names it and the cause."""

    title = "Migration failed"


def describe(url: str) -> str:
    """The database URL without credentials, for logs and messages."""
    return dialect_for_url(url).describe(url)


async def migrate(url: str) -> SchemaVersion:
    """Apply every pending migration to the database at ``url`` under the migration lock (any number of
    processes may call this at once: one migrates, the others wait and find nothing left). Returns the
    schema version now. Raises ``SchemaMismatch`` when a newer OSTE migrated the database,
    ``Unavailable`` when it cannot be reached, and ``MigrationFailed`` naming the migration that failed
    and why."""
    where = describe(url)
    applying: list[str] = []
    dialect_for_url(url).keep_private(url)

    def progress(event: str, app: str, name: str) -> None:
        if event == "apply_start":
            applying.append(name)

    try:
        async with migration_lock(url, where):
            before = await read_version(url)
            before.require_known(where)
            if not before.pending:
                return before
            executor.EXECUTOR_CACHE.clear()
            try:
                await run_migrations(config=tortoise_config(url), progress=progress)
            finally:
                await Tortoise.close_connections()
            after = await read_version(url)
    except OsteError:
        raise
    except Exception as exc:
        if isinstance(exc, OSError | DBConnectionError) or outage(exc):
            raise Unavailable(
                f"cannot migrate the {where}: {exc}. Is the database running and reachable?"
            ) from None
        failed = applying[-1] if applying else "(before the first migration)"
        raise MigrationFailed(
            f"migration {failed} of the {where} failed: {type(exc).__name__}: {exc}. The database stays "
            f"at the last migration that completed; fix the cause and run `oste migrate` again"
        ) from exc
    log.info(
        "migrated the %s from %s to %s (%d migrations)",
        where,
        before.current or "an empty database",
        after.current,
        len(applying),
    )
    return after


async def check_schema(url: str, require_current: bool = False) -> SchemaVersion:
    """The schema version of the database at ``url``, read without changing anything. Raises
    ``SchemaMismatch`` when this code cannot run on it: a newer OSTE migrated it, or (``require_current``:
    for commands that must not migrate) it is unmigrated or older."""
    where = describe(url)
    unreadable: tuple[type[BaseException], ...] = (OSError, *dialect_for_url(url).server_errors)
    try:
        version = await read_version(url)
    except unreadable as exc:
        raise Unavailable(
            f"cannot read the schema of the {where}: {exc}. Is the database running and reachable?"
        ) from None
    if require_current:
        version.require_current(where)
    else:
        version.require_known(where)
    return version


async def open_database(url: str, apply_migrations: bool = True, require_current: bool = False) -> Dialect:
    """Migrate (unless told not to) and connect the ORM for this process; returns the database's
    ``Dialect``, built here once and recorded (every part then finds it through ``dialect_of``).
    Without migrating, the schema is checked: never one a newer OSTE wrote, and with ``require_current``
    (``oste status``, ``oste export``, ``oste import``: commands that never migrate) exactly this
    code's (``check_schema``)."""
    dialect = dialect_for_url(url)
    if apply_migrations and not require_current:
        await migrate(url)
    else:
        await check_schema(url, require_current)
        dialect.keep_private(url)
    executor.EXECUTOR_CACHE.clear()
    dialect.guard_transactions()
    try:
        await Tortoise.init(config=tortoise_config(url, COMMAND_TIMEOUT), _enable_global_fallback=True)
    except (OSError, DBConnectionError) as exc:
        raise Unavailable(
            f"cannot open the {describe(url)}: {exc}. Is the database running and reachable?"
        ) from None
    _quiet_driver_outages()
    record_open(dialect)
    await dialect.opened(url)  # the session check, the log's checkpointer: what the dialect runs beside
    FULL.where = describe(normalise_url(url))
    log.info("database ready: %s", FULL.where)
    return dialect


async def close_database() -> None:
    """Close every connection (an unclosed aiosqlite thread would hang process exit), after what the
    open database's dialect runs beside them; the Dialect is forgotten."""
    dialect = forget_open()
    if dialect is not None:
        await dialect.closing()
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
    statement = dialect_of(connection).settle_statement
    await connection.execute_script(statement)
    return statement


# --- outages: the one place storage failures are classified --------------------------------------------

RETRY_AFTER_SECONDS = 5
"""How long a client is told to wait (``Retry-After``) when the database cannot be reached."""
OUTAGE_ADVICE = (
    "Retry after the Retry-After delay; a create repeated with the same Idempotency-Key is applied once "
    "even if this attempt was. Operator: {action}"
)
STORAGE_EXCEPTIONS: tuple[type[BaseException], ...] = (OSError, BaseORMException, *DRIVER_ERRORS)
"""Every exception type a database failure can surface as (the API maps these through ``outage``)."""

FULL_FOR = 10.0
"""Seconds after the last write refused for lack of space that the storage still counts as full."""


class FullDisk:
    """Whether this process's writes were refused for lack of space lately (``/readyz`` asks).

    Set by the outage classification each time a write fails because the volume is full (SQLite's
    ``SQLITE_FULL``, PostgreSQL's ``disk_full``, 53100); the first time of an episode logs one ERROR line
    naming the database and the failure. It counts as full until ``FULL_FOR`` seconds pass without such
    a failure: the engine keeps retrying its writes meanwhile, so a full volume keeps it set, and one
    freed lets it lapse. ``clock`` is monotonic time (injectable)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.where = "the database"
        self.last: float | None = None
        self.reason = ""

    def refused(self, reason: str) -> None:
        if not self.full:
            log.error(
                "the disk of %s is full: %s. Writes are refused (503) until space is freed there; "
                "nothing acknowledged is lost, and OSTE resumes by itself.",
                self.where,
                reason,
            )
        self.last = self.clock()
        self.reason = reason

    @property
    def full(self) -> bool:
        return self.last is not None and self.clock() - self.last < FULL_FOR


FULL = FullDisk()
"""This process's notice of a full disk."""


def outage(exc: BaseException) -> Unavailable | None:
    """``Unavailable`` when ``exc`` means the database cannot be used right now, else None.

    The one classification of storage failures, used by every store and by the API's error mapping:
    refused, reset or timed-out connections (any ``OSError``), PostgreSQL closing or refusing sessions
    (class 08, 57P01-57P05, class 53, read-only transactions), asyncpg's "connection is closed", and
    SQLite busy/locked/full/I-O errors, whether raw or wrapped by the ORM (its exceptions are searched
    through their causes, contexts and arguments). Errors in a statement itself are not outages.
    """
    for candidate in _chain(exc):
        found = _classify(candidate)
        if found is not None:
            return found
    return None


@asynccontextmanager
async def outages_unavailable() -> AsyncIterator[None]:
    """Run the block, turning any database outage (see ``outage``) into ``Unavailable``."""
    try:
        yield
    except Unavailable:
        raise
    except STORAGE_EXCEPTIONS as exc:
        unavailable = outage(exc)
        if unavailable is None:
            raise
        raise unavailable from exc


S = TypeVar("S", bound=type)


def raises_unavailable(cls: S) -> S:
    """Class decorator for a store: each public coroutine method turns outages into ``Unavailable``."""
    for name, method in list(vars(cls).items()):
        if not name.startswith("_") and inspect.iscoroutinefunction(method):
            setattr(cls, name, _guarded(method))
    return cls


def _guarded(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(method)
    async def guarded(*args: Any, **kwargs: Any) -> Any:
        async with outages_unavailable():
            return await method(*args, **kwargs)

    return guarded


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it wraps (cause, context, an exception passed as argument), breadth first."""
    seen: set[int] = set()
    queue = [exc]
    while queue and len(seen) < 16:
        current = queue.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        wrapped = [current.__cause__, current.__context__, *current.args]
        queue.extend(w for w in wrapped if isinstance(w, BaseException))


def _unavailable(what: str, action: str, exc: BaseException, retry_after: int | None = None) -> Unavailable:
    reason = str(exc).strip() or type(exc).__name__
    detail = f"{what} ({type(exc).__name__}: {reason}). " + OUTAGE_ADVICE.format(action=action)
    return Unavailable(detail, retry_after=retry_after or RETRY_AFTER_SECONDS)


def _classify(exc: BaseException) -> Unavailable | None:
    if isinstance(exc, Unavailable):
        return exc
    if isinstance(exc, OSError):
        return _unavailable("the database is unreachable", RECONNECT, exc)
    found = driver_outage(exc, FULL.where)  # a driver's own error: its dialect knows which are outages
    if found is None:
        return None
    if found.full_disk is not None:
        FULL.refused(found.full_disk)
    return _unavailable(found.what, found.action, exc, found.retry_after)


class _OneLineOutages(logging.Filter):
    """Turns a driver's log record with an outage's traceback into one line (the reason, no traceback)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and outage(error) is not None:
            record.msg = f"{record.getMessage()}: {type(error).__name__}: {error}"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
        return True


def _quiet_driver_outages() -> None:
    for name in DRIVER_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _OneLineOutages) for f in logger.filters):
            logger.addFilter(_OneLineOutages())
