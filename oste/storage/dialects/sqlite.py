"""SQLite: the embedded database, one file beside OSTE that one process holds.

``SqliteDialect`` writes OSTE's statements for it and looks after the file: its URL, its privacy, the
write-ahead log's checkpointer (``sqlite_checkpoints.py``), the migration lock (a ``flock`` of a file
beside it) and the read of the applied migrations, the one engine process per file
(``sqlite_writer_lock.py``), backups (``sqlite_backup.py``), the transaction guard
(``transactions.py``) and which of its errors are outages.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import sqlite3
import stat
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson
from tortoise.backends.base.client import BaseDBAsyncClient, TransactionalDBClient
from tortoise.exceptions import DBConnectionError, OperationalError
from tortoise.transactions import in_transaction

from oste.domain.claims import Completion
from oste.errors import ConfigurationError
from oste.eventloop import pause
from oste.storage.dialects import sqlite_checkpoints, sqlite_writer_lock, transactions
from oste.storage.dialects.admin import DriverOutage
from oste.storage.dialects.base import SET_COMPLETED, Dialect, Params, Placeholders, PreparedRows

if TYPE_CHECKING:
    from oste.storage.dialects.sqlite_backup import Restored, Snapshot

log = logging.getLogger("oste.storage")

PRIVATE_FILE = 0o600
"""The mode of the SQLite database and the files beside it: they hold every tenant's secrets."""
SIDE_FILES = ("-wal", "-shm", "-journal")
"""The files SQLite keeps beside a database file while it is open (or after a crash)."""
LOCKED_RETRY_AFTER_SECONDS = 2
"""``Retry-After`` when SQLite is locked by another writer past its busy timeout."""


class SqliteDialect(Dialect):
    """SQLite: one writer at a time, so a single ``UPDATE … WHERE id IN (SELECT … LIMIT n)`` claims
    atomically; list parameters are expanded, uuids are text, batch writes use ``VALUES`` lists."""

    name = "sqlite"
    title = "SQLite"
    url_form = "sqlite://PATH"
    schemes = ("sqlite://",)
    now_sql = "SELECT strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') AS now"
    greatest = "MAX"
    row_lock = ""
    row_locks = False
    pooled = False
    shared_by_processes = False
    local_file = True
    driver_errors = (sqlite3.Error,)
    server_errors = (sqlite3.Error,)
    settle_statement = "PRAGMA wal_checkpoint(TRUNCATE)"

    url_defaults = {
        "journal_mode": "WAL",
        "synchronous": "NORMAL",
        "busy_timeout": "5000",
        # no checkpoint inside a commit: the process's Checkpointer copies the log back, off the
        # request path (``sqlite_checkpoints``)
        "wal_autocheckpoint": "0",
    }

    def __init__(self) -> None:
        self._staged_count = 0
        self._staged_left: set[str] = set()
        """Staging tables to drop (their write ended, or their staging failed)."""

    def walked_past(self, column: str) -> str:
        # The unary + keeps SQLite's planner off the column's index: on ``activity_type_id IN (…)`` it
        # would read every scheduled activity of the types and sort them all (85 ms for a claim of 100
        # among 20,000 of one per-object type) instead of walking the due index and stopping at 100.
        return f"+{column}"

    def connection_identity(self, client: Any) -> tuple[Any, ...]:
        return (self.name, getattr(client, "filename", None))

    def describe(self, url: str) -> str:
        return f"SQLite file {urlsplit(url).path}"

    def file_of(self, url: str) -> Path:
        parts = urlsplit(url)
        return Path(parts.netloc + parts.path) if parts.netloc else Path(parts.path)

    # --- the file ----------------------------------------------------------------------------------

    def keep_private(self, url: str) -> None:
        # Create the database file readable by this user only (SQLite gives its ``-wal``, ``-shm`` and
        # ``-journal`` files the database file's mode), or take the group's and others' access away
        # from existing ones (a file an older OSTE created 0644), saying so once.
        path = self.file_of(url)
        if not str(path) or str(path) == ":memory:" or not path.parent.is_dir():
            return  # nothing to protect, or a missing directory that opening reports better
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE))  # an empty database
        for name in (path, *(Path(f"{path}{suffix}") for suffix in SIDE_FILES)):
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

    def guard_transactions(self) -> None:
        transactions.guard_sqlite_entry()

    async def opened(self, url: str) -> None:
        path = self.file_of(url)
        if str(path) not in ("", ":memory:"):
            await sqlite_checkpoints.start_checkpointer(path)  # the log is copied back off the request path

    async def closing(self) -> None:
        await sqlite_checkpoints.stop_checkpointer()

    async def read_migrations(self, url: str, app: str, table: str) -> list[str]:
        return await asyncio.to_thread(_recorded_migrations, self.file_of(url), app, table)

    def migration_lock(self, url: str, where: str) -> AbstractAsyncContextManager[None]:
        # One machine holds the file: an exclusive ``flock`` of a lock file beside it.
        return _file_lock(self.file_of(url), where)

    def hold_writer_lock(self, url: str, holder: str) -> AbstractContextManager[None]:
        # One engine process per file (``sqlite_writer_lock``); an in-memory database has no file.
        path = self.file_of(url)
        if not str(path) or str(path) == ":memory:":
            return contextlib.nullcontext()
        return sqlite_writer_lock.hold_writer_lock(path, holder)

    async def backup(self, url: str, path: Path, force: bool = False) -> Snapshot:
        # imported here: the backup checks its copy against the schema's rules (``oste.storage.schema``),
        # which reach the dialect through this package
        from oste.storage.dialects import sqlite_backup

        return await sqlite_backup.backup(self.file_of(url), path, force)

    async def restore(self, url: str, backup_file: Path) -> Restored:
        from oste.storage.dialects import sqlite_backup  # see ``backup``

        return await sqlite_backup.restore(self.file_of(url), backup_file)

    @staticmethod
    def outage_of(exc: BaseException, where: str) -> DriverOutage | None:
        if not isinstance(exc, sqlite3.Error) or getattr(exc, "sqlite_errorcode", None) is None:
            return None
        known = _OUTAGES.get(exc.sqlite_errorcode & 0xFF)
        if known is None:
            return None
        what, kind = known
        return DriverOutage(
            what,
            _ACTIONS[kind],
            retry_after=LOCKED_RETRY_AFTER_SECONDS if kind == "locked" else None,
            full_disk=f"{exc} ({where})" if kind == "full" else None,
        )

    def encode_time(self, value: datetime) -> Any:
        return value.isoformat(" ")

    def placeholder(self, index: int) -> str:
        return "?"

    def encode_uuid(self, value: uuid.UUID) -> Any:
        return str(value)

    def in_list(self, column: str, values: Sequence[Any], params: Placeholders, sql_type: str) -> str:
        if not values:
            return "1 = 0"
        marks = ", ".join(params.add(v) for v in values)
        return f"{column} IN ({marks})"

    def json_scalar_match(
        self, column: str, path: Sequence[str], text: str, number: tuple[float, float] | None, params: Params
    ) -> str:
        # ``json_extract`` gives a string as text, a boolean as 1 or 0, a number as a number (never
        # equal to text); ``json_type`` names a boolean true or false.
        at = "$" + "".join(f'."{key}"' for key in path)
        parts = [f"json_extract({column}, {params.add(at)}) = {params.add(text)}"]
        if text in ("true", "false"):
            parts.append(f"json_type({column}, {params.add(at)}) = {params.add(text)}")
        if number is not None:
            value, low, high = params.add(at), params.add(number[0]), params.add(number[1])
            parts.append(f"json_extract({column}, {value}) BETWEEN {low} AND {high}")
        return f"({' OR '.join(parts)})"

    def update_picked(self, table: str, key: str, assign: str, pick: str, returning: Sequence[str]) -> str:
        # One writer at a time: the sub-select and the update are one atomic statement.
        columns = ", ".join(returning)
        picked = f"SELECT {key} FROM {table} {pick}"
        return f"UPDATE {table} SET {assign} WHERE {key} IN ({picked}) RETURNING {columns}"

    def update_locked(self, table: str, assign: str, where: str) -> str:
        return f"UPDATE {table} SET {assign} WHERE {where} RETURNING id"

    async def apply_completions(
        self, conn: BaseDBAsyncClient, completions: Sequence[Completion], now: datetime
    ) -> set[uuid.UUID]:
        # The batch is one JSON parameter, so the statement's text (and its prepared form, which the
        # driver caches per connection) is the same whatever the batch size.
        sql = (
            "WITH v AS (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS token, "
            "json_extract(value, '$[2]') AS state, json_extract(value, '$[3]') AS retries, "
            "json_extract(value, '$[4]') AS attempts, json_extract(value, '$[5]') AS outcome, "
            "json_extract(value, '$[6]') AS next_at, json_extract(value, '$[7]') AS finished_at "
            "FROM json_each(?)) "
            f"UPDATE activity SET {SET_COMPLETED.format(table='activity', now='?')} FROM v "
            "WHERE activity.id = v.id AND activity.claim_token = v.token AND activity.state = 'running' "
            "RETURNING id"
        )
        found = await conn.execute_query_dict(sql, [_sqlite_completion_batch(completions), now])
        return {self.uuid_of(row["id"]) for row in found}

    def prepare_rows(
        self, table: str, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]
    ) -> PreparedRows:
        # One multi-row INSERT per ROWS_PER_STATEMENT rows: SQLite writes each in one step with the
        # GIL released, where executemany took it back for every row from the event loop's thread.
        names = tuple(name for name, _ in columns)
        statements = _values_statements(table, columns, rows, ROWS_PER_STATEMENT)
        return PreparedRows(table, names, statements=tuple(statements))

    async def insert_prepared(self, conn: BaseDBAsyncClient, prepared: PreparedRows) -> None:
        if prepared.staged is not None:
            await self._copy_staged(conn, prepared)
            return
        if len(prepared.statements) == 1:  # one statement is atomic on its own
            await conn.execute_query(*prepared.statements[0])
            return
        async with in_transaction(conn.connection_name) as tx:  # the caller's, or one of its own
            for sql, values in prepared.statements:
                await tx.execute_query(sql, values)

    async def stage_rows(
        self,
        conn: BaseDBAsyncClient,
        table: str,
        columns: Sequence[tuple[str, str]],
        rows: Sequence[Sequence[Any]],
    ) -> PreparedRows:
        # A 1,000-row INSERT held the one connection for 10-40 ms (its 30,000 values parsed and bound
        # with the GIL held, fighting the event loop), and every other request's write waited for it.
        # Staged, the write transaction runs one short statement that SQLite carries out in C with
        # the GIL released (about 5 ms for 1,000 rows); the staging statements of STAGE_ROWS rows
        # take the connection about 1 ms each and write no shared file (temporary tables are the
        # connection's own).
        if len(rows) <= STAGE_ROWS:
            return self.prepare_rows(table, columns, rows)
        await self._drop_leftovers(conn)
        self._staged_count += 1
        staged = f"temp.staged_{table}_{self._staged_count}"
        names = tuple(name for name, _ in columns)
        try:
            # no declared types: each value is kept as bound, and converted by the real table's
            # column as a direct insert would have
            await conn.execute_script(f"CREATE TABLE {staged} ({', '.join(names)})")
            for index, statement in enumerate(_values_statements(staged, columns, rows, STAGE_ROWS)):
                if index:
                    await pause()
                await conn.execute_query(*statement)
        except BaseException:
            self._staged_left.add(staged)
            raise
        listed = ", ".join(names)
        copy = f"INSERT INTO {table} ({listed}) SELECT {listed} FROM {staged} ORDER BY rowid"
        return PreparedRows(table, names, statements=((copy, []),), staged=staged, count=len(rows))

    async def discard_staged(self, conn: BaseDBAsyncClient, prepared: PreparedRows) -> None:
        if prepared.staged is None:
            return
        self._staged_left.add(prepared.staged)
        await self._drop_leftovers(conn)

    async def _drop_leftovers(self, conn: BaseDBAsyncClient) -> None:
        """Drop the staging tables no write needs any more. A drop inside a transaction that then
        rolls back leaves its table: it is dropped again on the next call (``IF EXISTS``: a
        connection that was replaced took its temporary tables with it)."""
        if isinstance(conn, TransactionalDBClient):
            return  # dropped by a later call, outside the transaction
        for staged in sorted(self._staged_left):
            with contextlib.suppress(OperationalError, DBConnectionError):
                await conn.execute_script(f"DROP TABLE IF EXISTS {staged}")
                self._staged_left.discard(staged)

    async def _copy_staged(self, conn: BaseDBAsyncClient, prepared: PreparedRows) -> None:
        """The staged rows into their table, in one statement: all of them, or Unavailable."""
        sql, values = prepared.statements[0]
        try:
            copied, _ = await conn.execute_query(sql, values)
        except OperationalError as exc:
            if "no such table" not in str(exc):
                raise
            copied = 0
        if copied != prepared.count:
            # the connection was replaced since the rows were staged (its temporary tables went
            # with it): nothing of them may be written
            raise DBConnectionError(
                f"{prepared.count - copied} of {prepared.count} staged rows were lost with their "
                "connection; nothing was written, send them again"
            )


def _values_statements(
    target: str, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]], per_statement: int
) -> list[tuple[str, list[Any]]]:
    """Multi-row INSERTs of ``rows`` into ``target``, ``per_statement`` rows each (fewer when the
    columns would pass SQLite's parameter limit), every value encoded as the driver's adapter would
    (uuids as text, instants as isoformat with a space)."""
    names = tuple(name for name, _ in columns)
    uuids = [i for i, (_, sql_type) in enumerate(columns) if sql_type == "uuid"]
    times = [i for i, (_, sql_type) in enumerate(columns) if sql_type == "timestamptz"]
    one = f"({', '.join('?' * len(columns))})"
    size = max(1, min(per_statement, SQLITE_VARIABLES // len(columns)))
    head = f"INSERT INTO {target} ({', '.join(names)}) VALUES "
    statements = []
    for start in range(0, len(rows), size):
        part = rows[start : start + size]
        values: list[Any] = []
        for row in part:
            item = list(row)
            for i in uuids:
                if item[i] is not None:
                    item[i] = str(item[i])
            for i in times:
                if isinstance(item[i], datetime):
                    item[i] = item[i].isoformat(" ")
            values.extend(item)
        statements.append((head + ", ".join([one] * len(part)), values))
    return statements


STAGE_ROWS = 100
"""Rows above which SQLite stages a write (``Dialect.stage_rows``), and rows of one staging statement
(about 1 ms of the connection each)."""
ROWS_PER_STATEMENT = 1000
"""Rows of one multi-row INSERT on SQLite (a 1,000-item batch is one statement; full statements of a
bigger one share their compiled form in the driver's statement cache)."""
SQLITE_VARIABLES = 32766
"""Parameters one SQLite statement may take (SQLite's default limit since 3.32)."""


def _sqlite_completion_batch(completions: Sequence[Completion]) -> str:
    """The JSON parameter of SQLite's completion statement: one array per completion (id, token,
    state, retries, attempt, outcome, next attempt, finished). orjson writes UUIDs and enums as their
    text itself, as ``str()`` would, without a Python call per value."""
    return orjson.dumps(
        [
            (
                c.activity_id,
                c.claim_token,
                c.state,
                c.retries,
                c.attempt,
                c.report.outcome,
                _sqlite_time(c.next_attempt_at),
                _sqlite_time(c.finished_at),
            )
            for c in completions
        ]
    ).decode()


def _sqlite_time(value: datetime | None) -> str | None:
    """A datetime as Tortoise's SQLite adapter stores it (``isoformat(" ")``), so stored values compare."""
    return None if value is None else value.isoformat(" ")


_ACTIONS = {
    "locked": "another process holds a write lock on the SQLite file longer than its busy_timeout; "
    "find and end it (only one `oste serve` may use a SQLite file).",
    "full": "free space on the volume of the SQLite file; OSTE resumes by itself once there is room.",
    "io": "check the SQLite file and its volume (permissions, mount, disk health).",
}
"""What an operator does about each kind of SQLite outage."""
_OUTAGES = {
    sqlite3.SQLITE_BUSY: ("the SQLite database is locked by another writer", "locked"),
    sqlite3.SQLITE_LOCKED: ("a SQLite table is locked by another connection", "locked"),
    sqlite3.SQLITE_FULL: ("the SQLite volume is full", "full"),
    sqlite3.SQLITE_IOERR: ("SQLite cannot read or write its file (disk I/O error)", "io"),
    sqlite3.SQLITE_CANTOPEN: ("SQLite cannot open its database file", "io"),
    sqlite3.SQLITE_READONLY: ("the SQLite database file is read-only", "io"),
}
"""SQLite's primary result codes that mean the database cannot be used right now: what happened and
the kind of outage (``_ACTIONS``)."""


def _recorded_migrations(path: Path, app: str, table: str) -> list[str]:
    """The migrations ``table`` of the file at ``path`` records for ``app``, read-only (a file that does
    not exist is not created)."""
    if not path.exists():
        return []
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        found = connection.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).fetchone()
        if found is None:
            return []
        rows = connection.execute(f"SELECT name FROM {table} WHERE app = ?", (app,)).fetchall()
        return [row[0] for row in rows]
    finally:
        connection.close()


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
