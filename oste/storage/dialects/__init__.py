"""The dialects: the only place where SQLite and PostgreSQL differ.

``open_database`` builds the one ``Dialect`` of the database it opens (``dialect_for_url``) and records
it (``record_open``); every part finds that same object through ``dialect_of(connection)``
(``Storage.dialect`` outside) and ``close_database`` forgets it. Every difference between the two
databases is one of its members: the statements OSTE writes (claims, completions, batch inserts, the
event stream, statistics, log shipping, bulk changes and their locking, the overview), the URL handling
(schemes, defaults, descriptions, the database file), connecting (the pool's session settings, a
primary and its standbys), opening and closing (the session check, the log's checkpointer, the
transaction guard), the schema's administration (the migration lock, the applied migrations), the one
engine process per file, backups, the outage classification of the drivers' errors, notices (in-process
or through the database) and the bulk-load settling. Texts for people that name a database take its
name and URL forms from here (``EMBEDDED``, ``SCALE_OUT``). No other module names a database
(``tests/unit/test_one_dialect.py``).

=========================  ===========================================================================
``base.py``                ``Dialect``: the statements' side, ``Params``, ``Query``, the open one
``admin.py``               ``DialectAdmin``: URLs, connecting, opening, locks, backups, outages, notices
``sqlite.py``              ``SqliteDialect``, with ``sqlite_backup.py`` (``oste backup``/``restore``),
                           ``sqlite_checkpoints.py`` (the log's checkpointer) and
                           ``sqlite_writer_lock.py`` (one engine process per file)
``postgres.py``            ``PostgresDialect``, with ``postgres_client.py`` (a primary and its standbys),
                           ``postgres_sessions.py`` (the session settings and their check) and
                           ``postgres_listener.py`` (the LISTEN connection)
``transactions.py``        the drivers' transactions, guarded so a failed ``BEGIN`` gives back what it took
=========================  ===========================================================================
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from oste.storage.dialects.admin import RECONNECT, BackupRefused, DialectAdmin, DriverOutage
from oste.storage.dialects.base import (
    EXECUTION_COLUMNS,
    Dialect,
    FollowOnWriter,
    Params,
    PreparedRows,
    Query,
    dialect_of,
    forget_open,
    json_of,
    optional_time_of,
    optional_uuid_of,
    record_open,
    time_of,
    uuid_of,
)
from oste.storage.dialects.postgres import PostgresDialect
from oste.storage.dialects.sqlite import STAGE_ROWS, SqliteDialect
from oste.storage.dialects.sqlite_writer_lock import WriterLocked

if TYPE_CHECKING:
    from oste.storage.dialects.sqlite_backup import Restored, Snapshot

__all__ = [
    "ACCEPTED_SCHEMES",
    "DATABASE_FILE",
    "DEFAULT_DATABASE_URL_FORM",
    "DRIVER_ERRORS",
    "DRIVER_LOGGERS",
    "EMBEDDED",
    "EXECUTION_COLUMNS",
    "MIGRATION_URL",
    "RECONNECT",
    "SCALE_OUT",
    "STAGE_ROWS",
    "BackupRefused",
    "Dialect",
    "DialectAdmin",
    "DriverOutage",
    "FollowOnWriter",
    "Params",
    "PostgresDialect",
    "PreparedRows",
    "Query",
    "SqliteDialect",
    "WriterLocked",
    "backup",
    "database_file_url",
    "dialect_for_url",
    "dialect_of",
    "driver_outage",
    "file_url",
    "forget_open",
    "hold_writer_lock",
    "json_of",
    "optional_time_of",
    "optional_uuid_of",
    "record_open",
    "restore",
    "time_of",
    "uuid_of",
]

KINDS: tuple[type[Dialect], ...] = (SqliteDialect, PostgresDialect)
"""Every dialect OSTE supports, in the order texts name them."""
EMBEDDED: type[Dialect] = SqliteDialect
"""The embedded database (a file beside OSTE, ``oste serve``'s default), for texts that name it."""
SCALE_OUT: type[Dialect] = PostgresDialect
"""The scale-out database (a server ``oste api`` and any number of ``oste worker`` share), for texts
that name it."""
ACCEPTED_SCHEMES = " or ".join(kind.schemes[0] for kind in KINDS)
"""The database URL schemes OSTE accepts, as messages name them."""

DATABASE_FILE = "oste.sqlite3"
"""The database file's name in the data directory when no database URL is given."""
DEFAULT_DATABASE_URL_FORM = f"{EMBEDDED.schemes[0]}<data dir>/{DATABASE_FILE}"
"""The default database URL as the settings' help shows it."""
MIGRATION_URL = "sqlite://./oste-makemigrations.sqlite3"
"""The scratch database ``tortoise makemigrations`` compares the models with."""

DRIVER_ERRORS: tuple[type[BaseException], ...] = tuple(
    error for kind in (PostgresDialect, SqliteDialect) for error in kind.driver_errors
)
"""Every exception type the dialects' drivers raise."""
DRIVER_LOGGERS = ("asyncpg", "asyncpg.pool", "tortoise", "tortoise.db_client")
"""Loggers of the database drivers whose outage tracebacks are shortened to one line."""


def dialect_for_url(url: str) -> Dialect:
    """A Dialect of a database URL (``sqlite://PATH``, ``postgres://…``, ``postgresql://…``,
    ``asyncpg://…``), newly built: ``open_database`` builds the open database's one with it, and what
    needs no open database asks it about the URL (its description, file, locks, backups). Raises
    ``ValueError`` for any other scheme."""
    for kind in KINDS:
        if url.startswith(kind.schemes):
            return kind()
    raise ValueError(f"a database URL must start with {ACCEPTED_SCHEMES}, got {url!r}")


def database_file_url(directory: Path) -> str:
    """The URL of the default database: a file named ``DATABASE_FILE`` in ``directory``."""
    return file_url((directory / DATABASE_FILE).resolve())


def file_url(path: Path) -> str:
    """The URL of the database file at ``path``."""
    return f"{EMBEDDED.schemes[0]}{path}"


def driver_outage(exc: BaseException, where: str) -> DriverOutage | None:
    """What a driver's error ``exc`` says about the database (``where``, for messages) when it means the
    database cannot be used right now, whichever dialect's driver raised it; None for any other error."""
    for kind in KINDS:
        found = kind.outage_of(exc, where)
        if found is not None:
            return found
    return None


def hold_writer_lock(url: str, holder: str) -> AbstractContextManager[None]:
    """Hold, for the block, the right to run the engine on the database of ``url`` (``holder``, e.g.
    ``oste serve on http://127.0.0.1:8080``, is written where a second process reads it): a SQLite file
    takes one engine process, which raises ``WriterLocked`` naming the running one; PostgreSQL any
    number. Raises ``ConfigurationError`` when the lock cannot be made (a missing or read-only
    directory)."""
    return dialect_for_url(url).hold_writer_lock(url, holder)


async def backup(url: str, path: Path, force: bool = False) -> Snapshot:
    """`oste backup`: a checked copy of the database of ``url`` at ``path`` made while it runs, or
    ``BackupRefused`` saying why (PostgreSQL: naming its own tools)."""
    return await dialect_for_url(url).backup(url, path, force)


async def restore(url: str, backup_file: Path) -> Restored:
    """`oste restore`: ``backup_file`` put in place of the database of ``url``, or ``BackupRefused``
    saying why (PostgreSQL: naming its own tools)."""
    return await dialect_for_url(url).restore(url, backup_file)
