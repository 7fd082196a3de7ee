"""Opening, migrating and closing the database, and telling an outage from any other storage error."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import sqlite3
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import asyncpg
from tortoise import Tortoise
from tortoise.backends.base import executor
from tortoise.exceptions import BaseORMException, DBConnectionError
from tortoise.migrations.api import migrate as run_migrations

from oste.errors import OsteError, Unavailable
from oste.storage.checkpoints import start_checkpointer, stop_checkpointer
from oste.storage.config import COMMAND_TIMEOUT, normalise_url, tortoise_config
from oste.storage.dialects import DRIVER_LOGGERS, Dialect, dialect_for_url, dialect_of
from oste.storage.schema import SchemaVersion, migration_lock, read_version
from oste.storage.session_check import warn_without_session_settings
from oste.storage.transactions import guard_transaction_entry

log = logging.getLogger("oste.storage")


class MigrationFailed(OsteError):
    """A migration failed for another reason than an outage; the message names it and the cause."""

    title = "Migration failed"


def describe(url: str) -> str:
    """The database URL without credentials, for logs and messages."""
    return dialect_for_url(url).describe(url)


PRIVATE_FILE = 0o600
"""The mode of the SQLite database and the files beside it: they hold every tenant's secrets."""
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def keep_sqlite_private(url: str) -> None:
    """For a SQLite URL: create the database file readable by this user only (SQLite gives its ``-wal``,
    ``-shm`` and ``-journal`` files the database file's mode), or take the group's and others' access
    away from existing ones (a file an older OSTE created 0644), saying so once. No-op for PostgreSQL
    and an in-memory database."""
    path = dialect_for_url(url).file_of(url)
    if path is None or not str(path) or str(path) == ":memory:" or not path.parent.is_dir():
        return  # nothing to protect, or a missing directory that opening reports better
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))  # an empty database
    for name in (path, *(Path(f"{path}{suffix}") for suffix in SQLITE_SIDE_FILES)):
        try:
            mode = name.stat().st_mode
        except FileNotFoundError:
            continue
        if mode & 0o077:
            os.chmod(name, stat.S_IMODE(mode) & ~0o077)
            log.warning(
                "%s was readable by other users (mode %o): made private (mode %o); it holds every "
                "tenant's secrets",
                name,
                stat.S_IMODE(mode),
                stat.S_IMODE(mode) & ~0o077,
            )


async def migrate(url: str) -> SchemaVersion:
    """Apply every pending migration to the database at ``url`` under the migration lock (any number of
    processes may call this at once: one migrates, the others wait and find nothing left). Returns the
    schema version now. Raises ``SchemaMismatch`` when a newer OSTE migrated the database,
    ``Unavailable`` when it cannot be reached, and ``MigrationFailed`` naming the migration that failed
    and why."""
    where = describe(url)
    applying: list[str] = []
    keep_sqlite_private(url)

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
        if isinstance(exc, OSError | DBConnectionError | asyncpg.PostgresConnectionError) or outage(exc):
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
    try:
        version = await read_version(url)
    except (OSError, asyncpg.PostgresError, sqlite3.Error) as exc:
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
    ``Dialect``, built here once (every part then finds it through ``dialect_of``). Without migrating,
    the schema is checked: never one a newer OSTE wrote, and with ``require_current`` (``oste status``,
    ``oste export``, ``oste import``: commands that never migrate) exactly this code's
    (``check_schema``)."""
    dialect = dialect_for_url(url)
    if apply_migrations and not require_current:
        await migrate(url)
    else:
        await check_schema(url, require_current)
        keep_sqlite_private(url)
    executor.EXECUTOR_CACHE.clear()
    guard_transaction_entry()
    try:
        await Tortoise.init(config=tortoise_config(url, COMMAND_TIMEOUT), _enable_global_fallback=True)
    except (OSError, DBConnectionError) as exc:
        raise Unavailable(
            f"cannot open the {describe(url)}: {exc}. Is the database running and reachable?"
        ) from None
    _quiet_driver_outages()
    await warn_without_session_settings(urlsplit(url).username)
    path = dialect.file_of(url) if dialect.local_file else None
    if path is not None and str(path) not in ("", ":memory:"):
        await start_checkpointer(path)  # the log is copied back off the request path
    FULL.where = describe(normalise_url(url))
    log.info("database ready: %s", FULL.where)
    return dialect


async def close_database() -> None:
    """Close every connection (an unclosed aiosqlite thread would hang process exit)."""
    await stop_checkpointer()
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
LOCKED_RETRY_AFTER_SECONDS = 2
"""``Retry-After`` when SQLite is locked by another writer past its busy timeout."""
OUTAGE_ADVICE = (
    "Retry after the Retry-After delay; a create repeated with the same Idempotency-Key is applied once "
    "even if this attempt was. Operator: {action}"
)
STORAGE_EXCEPTIONS: tuple[type[BaseException], ...] = (
    OSError,
    BaseORMException,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    sqlite3.Error,
)
"""Every exception type a database failure can surface as (the API maps these through ``outage``)."""

_SQLITE_OUTAGES = {
    sqlite3.SQLITE_BUSY: ("the SQLite database is locked by another writer", "locked"),
    sqlite3.SQLITE_LOCKED: ("a SQLite table is locked by another connection", "locked"),
    sqlite3.SQLITE_FULL: ("the SQLite volume is full", "full"),
    sqlite3.SQLITE_IOERR: ("SQLite cannot read or write its file (disk I/O error)", "io"),
    sqlite3.SQLITE_CANTOPEN: ("SQLite cannot open its database file", "io"),
    sqlite3.SQLITE_READONLY: ("the SQLite database file is read-only", "io"),
}
_ACTIONS = {
    "connection": "check that the database server is running and reachable from this node; OSTE "
    "reconnects by itself once it is.",
    "locked": "another process holds a write lock on the SQLite file longer than its busy_timeout; "
    "find and end it (only one `oste serve` may use a SQLite file).",
    "full": "free space on the volume of the SQLite file; OSTE resumes by itself once there is room.",
    "io": "check the SQLite file and its volume (permissions, mount, disk health).",
    "disk-full": "free space on the database server's data volume (the tablespace named above); OSTE "
    "resumes by itself once there is room.",
    "resources": "the database server is out of connections, memory or disk; raise its limits or "
    "lower OSTE's pool size (maxsize in OSTE_DATABASE_URL).",
    "read-only": "the database refuses writes (a standby after a failover?); point OSTE_DATABASE_URL "
    "at the primary.",
}


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


def _unavailable(
    what: str, kind: str, exc: BaseException, retry_after: int = RETRY_AFTER_SECONDS
) -> Unavailable:
    reason = str(exc).strip() or type(exc).__name__
    detail = f"{what} ({type(exc).__name__}: {reason}). " + OUTAGE_ADVICE.format(action=_ACTIONS[kind])
    return Unavailable(detail, retry_after=retry_after)


def _classify(exc: BaseException) -> Unavailable | None:
    if isinstance(exc, Unavailable):
        return exc
    if isinstance(exc, OSError):
        return _unavailable("the database is unreachable", "connection", exc)
    if isinstance(exc, asyncpg.PostgresConnectionError) or (
        isinstance(exc, asyncpg.OperatorInterventionError) and not isinstance(exc, asyncpg.QueryCanceledError)
    ):
        return _unavailable("the database closed or refused the connection", "connection", exc)
    if isinstance(exc, asyncpg.InterfaceError) and "closed" in str(exc):
        return _unavailable("the database connection was lost", "connection", exc)
    if isinstance(exc, asyncpg.InternalClientError) and "another operation" in str(exc):
        # a connection whose server died mid-statement, still marked busy by the statement it lost
        return _unavailable("the database connection was lost", "connection", exc)
    if isinstance(exc, asyncpg.DiskFullError):
        FULL.refused(str(exc).strip())
        return _unavailable("the database server's disk is full", "disk-full", exc)
    if isinstance(exc, asyncpg.InsufficientResourcesError):
        return _unavailable("the database server is out of resources", "resources", exc)
    if isinstance(exc, asyncpg.ReadOnlySQLTransactionError):
        return _unavailable("the database is read-only", "read-only", exc)
    if isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorcode", None) is not None:
        known = _SQLITE_OUTAGES.get(exc.sqlite_errorcode & 0xFF)
        if known is not None:
            what, kind = known
            if kind == "full":
                FULL.refused(f"{exc} ({FULL.where})")
            wait = LOCKED_RETRY_AFTER_SECONDS if kind == "locked" else RETRY_AFTER_SECONDS
            return _unavailable(what, kind, exc, wait)
    return None


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
