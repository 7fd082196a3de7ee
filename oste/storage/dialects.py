"""The ``Dialect``: the only place where SQLite and PostgreSQL differ.

``open_database`` builds the database's Dialect once (``dialect_for_url``) and every part finds that
same object through ``dialect_of(connection)`` (``Storage.dialect`` outside): every statement OSTE
writes in SQL (claims, completions, batch inserts, the event stream, statistics, log shipping, bulk
changes, the overview) takes its placeholders, casts, value encodings, row locking and
dialect-specific functions from it, or from a ``Query`` built on it; so do the URL handling (schemes,
defaults, descriptions, the database file), the notices (in-process or through the database), the
session-settings check and the bulk-load settling. No other module branches on the database's name
(``tests/unit/test_one_dialect.py``).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
import orjson
from tortoise import connections
from tortoise.backends.base.client import BaseDBAsyncClient, TransactionalDBClient
from tortoise.exceptions import DBConnectionError, IntegrityError, OperationalError
from tortoise.transactions import in_transaction

from oste.domain.claims import Completion
from oste.domain.ids import new_id
from oste.eventloop import pause

EXECUTION_COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "uuid"),
    ("activity_id", "uuid"),
    ("attempt", "int"),
    ("started_at", "timestamptz"),
    ("finished_at", "timestamptz"),
    ("duration_ms", "float8"),
    ("outcome", "text"),
    ("http_status", "int"),
    ("error", "text"),
    ("response_excerpt", "text"),
    ("node", "text"),
)
"""The execution table's columns with their PostgreSQL types, in ``_execution_values`` order."""

FollowOnWriter = Callable[[BaseDBAsyncClient, "Dialect", Sequence[Completion], datetime], Awaitable[int]]
"""Writes the follow-ons of just-written completions inside their transaction (``storage.chains``)."""


@dataclass(frozen=True)
class PreparedRows:
    """Rows made ready for ``Dialect.insert_prepared`` before a transaction opens: every value
    encoded and every statement built (SQLite), or the records of one COPY (PostgreSQL)."""

    table: str
    names: tuple[str, ...]
    records: Sequence[Sequence[Any]] = ()
    """PostgreSQL: the rows, as given."""
    statements: tuple[tuple[str, list[Any]], ...] = ()
    """SQLite: multi-row INSERTs with their values, in order."""
    staged: str | None = None
    """SQLite: the connection's temporary table the rows wait in (``Dialect.stage_rows``), by its
    qualified name; the one statement then copies them all (checked: ``count`` rows, or the
    connection was replaced)."""
    count: int = 0
    """How many rows (of a staged set)."""


class Params:
    """Collects query parameters and hands out the dialect's placeholders in order."""

    def __init__(self, strategy: Dialect) -> None:
        self.strategy = strategy
        self.values: list[Any] = []

    def add(self, value: Any) -> str:
        self.values.append(value)
        return self.strategy.placeholder(len(self.values))

    def uid(self, value: uuid.UUID) -> str:
        return self.add(self.strategy.encode_uuid(value))


class Query:
    """One raw statement's parameters on the open connection (or ``conn``), in its dialect: values are
    encoded as the driver takes them and placeholders handed out in order."""

    def __init__(self, conn: Any = None) -> None:
        self.conn = conn if conn is not None else connections.get("default")
        self.strategy = dialect_of(self.conn)
        self.values: list[Any] = []

    def add(self, value: Any) -> str:
        if isinstance(value, uuid.UUID):
            value = self.strategy.encode_uuid(value)
        elif isinstance(value, datetime):
            value = self.strategy.encode_time(value)
        self.values.append(value)
        return self.strategy.placeholder(len(self.values))

    def in_ids(self, column: str, ids: Sequence[uuid.UUID]) -> str:
        if not ids:
            return "1 = 0"
        return f"{column} IN ({', '.join(self.add(i) for i in ids)})"

    async def rows(self, sql: str) -> list[dict[str, Any]]:
        return list(await self.conn.execute_query_dict(sql, self.values))


class Dialect:
    """Dialect hooks shared by both strategies; subclasses fill in the differences."""

    name = "generic"
    now_sql = ""
    """A statement answering the database's current time as ``now``."""
    txid_sql = "0"
    """The current transaction's id as a bigint (the event stream's order; 0 where one writer commits
    at a time)."""
    streamable_sql = ""
    """A condition on ``txid`` true for rows no later row can appear behind (empty: all rows are)."""
    greatest = "GREATEST"
    """The function giving the larger of two values."""
    row_lock = " FOR UPDATE"
    """What locks the rows a SELECT reads until the transaction ends (SQLite: one writer, no clause)."""
    schemes: tuple[str, ...] = ()
    """The database URL schemes of this dialect (``dialect_for_url``)."""
    row_locks = True
    """True where writers lock rows (PostgreSQL: lock them in a fixed order, ``FOR KEY SHARE`` where a
    read must not wait); False where the one writer holds the whole database (SQLite)."""
    pooled = True
    """True where a pool of connections lets other requests run while a transaction holds one (several
    completion batches write at once, a big insert pauses for others); False where the process has one
    connection and a transaction holds it (SQLite)."""
    shared_by_processes = True
    """True where several processes use the database (PostgreSQL: the scale-out engine), so notices
    travel through it (LISTEN/NOTIFY); False where one process holds it (SQLite: API and engine share
    it, and a notice is an in-process wake-up)."""
    local_file = False
    """True where the database is a file beside OSTE (SQLite, in the data directory by default)."""
    session_settings = True
    """True where OSTE asks the server for session settings a pooler may drop (PostgreSQL), so they are
    checked at start-up."""
    settle_statement = ""
    """What ``settle_after_bulk_load`` runs: the work the database would have done in the background."""

    url_defaults: dict[str, str] = {}
    """Query parameters a database URL gets unless it sets them (SQLite pragmas, the pool's size)."""

    def connection_identity(self, client: Any) -> tuple[Any, ...]:
        """What tells one database from another for a Tortoise client (one notice hub per database)."""
        raise NotImplementedError

    def normalise_url(self, url: str) -> str:
        """Tortoise's spelling of a database URL of this dialect, with OSTE's defaults."""
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        for key, value in self.url_defaults.items():
            query.setdefault(key, value)
        return urlunsplit((self.name, parts.netloc, parts.path, urlencode(query), parts.fragment))

    def describe(self, url: str) -> str:
        """The database URL without credentials, for logs and messages."""
        raise NotImplementedError

    def file_of(self, url: str) -> Path | None:
        """The database file a URL names (None where the database is a server)."""
        return None

    def cast(self, sql_type: str) -> str:
        """A parameter's cast to ``sql_type`` where the dialect needs it (``::uuid``), else nothing."""
        return ""

    def encode_time(self, value: datetime) -> Any:
        """A datetime as the driver takes it in a raw statement."""
        return value

    def placeholder(self, index: int) -> str:
        raise NotImplementedError

    def encode_uuid(self, value: uuid.UUID) -> Any:
        return value

    def in_list(self, column: str, values: Sequence[Any], params: Params, sql_type: str) -> str:
        """``column IN (...)`` over a Python list (``sql_type`` names the PostgreSQL array type)."""
        raise NotImplementedError

    object_lock_sql = ""
    """A statement that waits for, then holds until its transaction ends, the lock of one key (its one
    parameter, text): creates of one object under ``on_new`` take it one after the other. Empty where
    one writer at a time holds the whole database (SQLite)."""

    def walked_past(self, column: str) -> str:
        """``column`` in a claim's condition that must not choose the claim's index: the claim walks the
        due index in ``next_attempt_at`` order and stops at its limit. PostgreSQL plans it by cost."""
        return column

    def take_turn(self, condition: str, key: str) -> str:
        """A claim's condition that holds when ``condition`` does and, where several claimers run at
        once, this one alone holds the turn of ``key`` (an SQL text expression) until its transaction
        ends; a key another claimer holds is skipped, never waited for."""
        return f"({condition})"

    def update_picked(self, table: str, key: str, assign: str, pick: str, returning: Sequence[str]) -> str:
        """One statement that picks rows (``pick``: ``WHERE … ORDER BY … LIMIT n``), updates them with
        ``assign`` and returns ``returning``; concurrent callers pick disjoint rows."""
        raise NotImplementedError

    @staticmethod
    def uuid_of(value: Any) -> uuid.UUID:
        """A raw query's UUID from a NOT NULL column: a UUID on PostgreSQL, text on SQLite."""
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))

    @classmethod
    def optional_uuid_of(cls, value: Any) -> uuid.UUID | None:
        """``uuid_of`` for a nullable column."""
        return None if value is None else cls.uuid_of(value)

    @staticmethod
    def time_of(value: Any) -> datetime:
        """A raw query's datetime from a NOT NULL column (aware on PostgreSQL, ISO text on SQLite), in
        UTC; a naive value is read as UTC."""
        instant = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
        return instant.astimezone(UTC) if instant.tzinfo is not None else instant.replace(tzinfo=UTC)

    @staticmethod
    def json_of(value: Any) -> Any:
        """A raw query's JSON column: decoded on PostgreSQL, text on SQLite."""
        return orjson.loads(value) if isinstance(value, str | bytes) else value

    @classmethod
    def optional_time_of(cls, value: Any) -> datetime | None:
        """``time_of`` for a nullable column."""
        return None if value is None else cls.time_of(value)

    def json_param(self, params: Params, text: str) -> str:
        """A placeholder for JSON given as text, for a JSON column."""
        return params.add(text)

    def json_scalar_match(
        self, column: str, path: Sequence[str], text: str, number: tuple[float, float] | None, params: Params
    ) -> str:
        """A condition true for every row whose JSON ``column`` holds, at ``path`` (keys), a string
        equal to ``text``, the boolean ``text`` names (``true``/``false``), or (``number`` given) a
        number within those bounds. It may hold for more rows: a prefilter the caller checks exactly."""
        raise NotImplementedError

    def update_locked(self, table: str, assign: str, where: str) -> str:
        """An update of the rows matching ``where`` that locks them in id order, returning their ids.

        Every multi-row write to claimed activities goes through this (or locks in id order itself),
        so concurrent writers of overlapping rows wait for each other instead of deadlocking.
        """
        raise NotImplementedError

    async def record_completions(
        self,
        connection: str,
        completions: Sequence[Completion],
        now: datetime,
        follow_ons: FollowOnWriter | None = None,
    ) -> set[uuid.UUID]:
        """Atomically write each completion whose claim token is still current: the activity's next
        state and one execution row (its attempt). Returns the ids of the activities written.

        With ``follow_ons`` (given only when some completion carries a ``follow_on``), it is called in
        the same transaction with the completions written, so a follow-on exists exactly when its
        cause's completion does. The base form is a transaction of two statements (the strategy's
        ``apply_completions``, then the execution rows); a strategy may do both in one statement.
        """
        async with in_transaction(connection) as conn:
            ids = await self.apply_completions(conn, completions, now)
            rows = [_execution_values(new_id(), c) for c in completions if c.activity_id in ids]
            if rows:
                await self.insert_rows(conn, "execution", EXECUTION_COLUMNS, rows)
            if follow_ons is not None and ids:
                await follow_ons(conn, self, [c for c in completions if c.activity_id in ids], now)
        return ids

    async def apply_completions(
        self, conn: BaseDBAsyncClient, completions: Sequence[Completion], now: datetime
    ) -> set[uuid.UUID]:
        """Write each completion's activity state if its claim token is still current; the ids written."""
        raise NotImplementedError

    async def insert_rows(
        self,
        conn: BaseDBAsyncClient,
        table: str,
        columns: Sequence[tuple[str, str]],
        rows: Sequence[Sequence[Any]],
    ) -> None:
        """Insert many rows atomically; ``columns`` are (name, PostgreSQL type) pairs and each row
        holds their values in that order (uuids as ``uuid.UUID``, JSON as text)."""
        await self.insert_prepared(conn, self.prepare_rows(table, columns, rows))

    def prepare_rows(
        self, table: str, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]
    ) -> PreparedRows:
        """``insert_rows``' work that needs no connection, done now: call it before the transaction
        that inserts them opens, so the transaction holds only the statements."""
        return PreparedRows(table, tuple(name for name, _ in columns), records=rows)

    async def insert_prepared(self, conn: BaseDBAsyncClient, prepared: PreparedRows) -> None:
        """Insert rows ``prepare_rows`` (or ``stage_rows``) made ready, atomically."""
        raise NotImplementedError

    async def stage_rows(
        self,
        conn: BaseDBAsyncClient,
        table: str,
        columns: Sequence[tuple[str, str]],
        rows: Sequence[Sequence[Any]],
    ) -> PreparedRows:
        """``prepare_rows``, and on a database where a write transaction holds every request's one
        connection (SQLite) the rows' encoding and parsing done too, outside any transaction: they
        wait on ``conn`` in a temporary table written in short statements, with a pause between
        (``oste.eventloop.pause``), and the transaction only copies them over in one statement.
        Call ``discard_staged`` once that transaction has ended, written or not."""
        return self.prepare_rows(table, columns, rows)

    async def discard_staged(self, conn: BaseDBAsyncClient, prepared: PreparedRows) -> None:
        """Drop what ``stage_rows`` kept for ``prepared`` (nothing, but on SQLite)."""

    async def insert_rows_skipping(
        self,
        conn: BaseDBAsyncClient,
        table: str,
        columns: Sequence[tuple[str, str]],
        rows: Sequence[Sequence[Any]],
    ) -> set[uuid.UUID]:
        """``insert_rows``, leaving out each row whose unique key is taken already (a replayed
        completion's follow-on, an occurrence planned twice); the ids written (each row's first
        column). Statements of ``SKIPPING_CHUNK`` rows (bound parameters are limited), in the caller's
        transaction when it has one."""
        written: set[uuid.UUID] = set()
        for start in range(0, len(rows), SKIPPING_CHUNK):
            written |= await self._insert_skipping(conn, table, columns, rows[start : start + SKIPPING_CHUNK])
        return written

    async def _insert_skipping(
        self,
        conn: BaseDBAsyncClient,
        table: str,
        columns: Sequence[tuple[str, str]],
        rows: Sequence[Sequence[Any]],
    ) -> set[uuid.UUID]:
        p = Params(self)
        values = []
        for row in rows:
            marks = []
            for (_, sql_type), value in zip(columns, row, strict=True):
                if value is None:
                    marks.append(p.add(None))
                elif sql_type == "uuid":
                    marks.append(p.uid(value))
                elif sql_type == "jsonb":
                    marks.append(self.json_param(p, value))
                else:
                    marks.append(p.add(value))
            values.append(f"({', '.join(marks)})")
        names = ", ".join(name for name, _ in columns)
        sql = f"INSERT INTO {table} ({names}) VALUES {', '.join(values)} ON CONFLICT DO NOTHING RETURNING id"
        return {self.uuid_of(row["id"]) for row in await conn.execute_query_dict(sql, p.values)}


_SET_COMPLETED = (
    "state = v.state, retries = v.retries, last_outcome = v.outcome, "
    # a snoozed or expired attempt is recorded (its execution) but not counted: no request, or the
    # receiver's own "later"
    "attempts = CASE WHEN v.outcome IN ('snoozed', 'expired') THEN v.attempts - 1 ELSE v.attempts END, "
    "snoozes = CASE WHEN v.outcome = 'snoozed' THEN {table}.snoozes + 1 ELSE {table}.snoozes END, "
    "next_attempt_at = COALESCE(v.next_at, {table}.next_attempt_at), finished_at = v.finished_at, "
    "claimed_by = NULL, claim_token = NULL, lease_expires_at = NULL, updated_at = {now}"
)


_PG_COMPLETE = (
    "WITH v AS (SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::int[], $5::int[], "
    "$6::text[], $7::timestamptz[], $8::timestamptz[], $9::uuid[], $10::timestamptz[], "
    "$11::timestamptz[], $12::float8[], $13::int[], $14::text[], $15::text[], $16::text[]) "
    "AS v(id, token, state, retries, attempts, outcome, next_at, finished_at, "
    "execution_id, started_at, ended_at, duration_ms, http_status, error, excerpt, node)), "
    "locked AS MATERIALIZED (SELECT a.id FROM activity a "
    "JOIN v ON a.id = v.id AND a.claim_token = v.token "
    "WHERE a.state = 'running' ORDER BY a.id FOR UPDATE OF a), "
    f"done AS (UPDATE activity SET {_SET_COMPLETED.format(table='activity', now='$17')} FROM v, locked "
    "WHERE activity.id = v.id AND activity.id = locked.id AND activity.claim_token = v.token "
    "AND activity.state = 'running' RETURNING activity.id) "
    f"INSERT INTO execution ({', '.join(name for name, _ in EXECUTION_COLUMNS)}) "
    "SELECT v.execution_id, v.id, v.attempts, v.started_at, v.ended_at, v.duration_ms, v.outcome, "
    "v.http_status, v.error, v.excerpt, v.node FROM v JOIN done ON done.id = v.id "
    "RETURNING activity_id"
)
"""Completions in one statement on PostgreSQL: the activities still claimed under their tokens get
their next state, and exactly those get their execution row. One array parameter per column of ``v``
(``_pg_completion_columns``): binary arrays cost the server less than parsing the batch as JSON text,
and in a scale-out deployment the server is what every worker shares."""


class PostgresDialect(Dialect):
    """PostgreSQL: ``FOR UPDATE SKIP LOCKED`` claims, array parameters, completions in one statement,
    batch inserts by binary ``COPY``."""

    name = "postgres"
    now_sql = "SELECT clock_timestamp() AS now"
    txid_sql = "pg_current_xact_id()::text::bigint"
    streamable_sql = "txid < pg_snapshot_xmin(pg_current_snapshot())::text::bigint"
    schemes = ("postgres://", "postgresql://", "asyncpg://")
    settle_statement = "VACUUM (ANALYZE) activity"

    url_defaults = {"minsize": "1", "maxsize": "20"}

    def describe(self, url: str) -> str:
        parts = urlsplit(url)
        hosts = parts.netloc.rpartition("@")[2] or "localhost"
        if "," not in hosts and ":" not in hosts.rpartition("]")[2]:
            hosts += ":5432"
        return f"PostgreSQL {hosts}{parts.path}"

    def connection_identity(self, client: Any) -> tuple[Any, ...]:
        # str(): a client given a list of hosts (``oste.storage.pgclient``) holds lists
        return (self.name, str(client.host), str(client.port), client.user, client.database, client.schema)

    def cast(self, sql_type: str) -> str:
        return f"::{sql_type}"

    def placeholder(self, index: int) -> str:
        return f"${index}"

    def in_list(self, column: str, values: Sequence[Any], params: Params, sql_type: str) -> str:
        return f"{column} = ANY({params.add(list(values))}::{sql_type}[])"

    def json_scalar_match(
        self, column: str, path: Sequence[str], text: str, number: tuple[float, float] | None, params: Params
    ) -> str:
        # ``#>>`` gives a string unquoted, a boolean as true/false, a number as PostgreSQL writes it.
        at = f"{params.add(list(path))}::text[]"
        condition = f"{column} #>> {at} = {params.add(text)}"
        if number is None:
            return condition
        low, high = (params.add(bound) for bound in number)
        return (
            f"({condition} OR CASE WHEN jsonb_typeof({column} #> {at}) = 'number' "
            f"THEN ({column} #> {at})::numeric BETWEEN {low}::numeric AND {high}::numeric END)"
        )

    object_lock_sql = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))"

    def take_turn(self, condition: str, key: str) -> str:
        # CASE evaluates the lock after the condition: only objects whose activity may start are locked.
        return (
            f"CASE WHEN {condition} THEN pg_try_advisory_xact_lock(hashtextextended({key}, 0)) ELSE false END"
        )

    def update_picked(self, table: str, key: str, assign: str, pick: str, returning: Sequence[str]) -> str:
        # A MATERIALIZED CTE runs the LIMIT once: "WHERE id IN (SELECT … LIMIT n FOR UPDATE SKIP LOCKED)"
        # may be re-executed by the planner and then update more than n rows.
        columns = ", ".join(f"{table}.{c}" for c in returning)
        return (
            f"WITH picked AS MATERIALIZED (SELECT {key} FROM {table} {pick} FOR UPDATE SKIP LOCKED) "
            f"UPDATE {table} SET {assign} FROM picked WHERE {table}.{key} = picked.{key} RETURNING {columns}"
        )

    def update_locked(self, table: str, assign: str, where: str) -> str:
        return (
            f"WITH locked AS MATERIALIZED (SELECT id FROM {table} WHERE {where} ORDER BY id FOR UPDATE) "
            f"UPDATE {table} SET {assign} FROM locked WHERE {table}.id = locked.id RETURNING {table}.id"
        )

    async def record_completions(
        self,
        connection: str,
        completions: Sequence[Completion],
        now: datetime,
        follow_ons: FollowOnWriter | None = None,
    ) -> set[uuid.UUID]:
        # One statement, so one round trip and no explicit transaction: lock the activities still
        # claimed under the completions' tokens (in id order, as every writer of claimed rows does),
        # write their next state, and insert an execution row for exactly those. Only a batch with
        # follow-ons pays for a transaction and the statements that create them.
        values = _pg_completion_columns(completions, now)
        if follow_ons is None:
            rows = await connections.get(connection).execute_query_dict(_PG_COMPLETE, values)
            return {self.uuid_of(row["activity_id"]) for row in rows}
        async with in_transaction(connection) as conn:
            rows = await conn.execute_query_dict(_PG_COMPLETE, values)
            ids = {self.uuid_of(row["activity_id"]) for row in rows}
            if ids:
                await follow_ons(conn, self, [c for c in completions if c.activity_id in ids], now)
        return ids

    def json_param(self, params: Params, text: str) -> str:
        return f"{params.add(text)}::text::jsonb"

    async def insert_prepared(self, conn: BaseDBAsyncClient, prepared: PreparedRows) -> None:
        # Binary COPY: one statement, all rows or none, and the driver encodes each row's values
        # straight into the stream (an array parameter per column costs it an abstract-base-class
        # check per element, which made it most of the API process's time in a batch create).
        rows = prepared.records
        records = _paced(rows) if len(rows) > PACE else rows
        try:
            async with conn.acquire_connection() as raw:
                await raw.copy_records_to_table(prepared.table, records=records, columns=prepared.names)
        except asyncpg.IntegrityConstraintViolationError as exc:
            raise IntegrityError(str(exc)) from exc
        except (OSError, asyncpg.InterfaceError, asyncpg.ConnectionDoesNotExistError) as exc:
            raise DBConnectionError(str(exc)) from exc


class SqliteDialect(Dialect):
    """SQLite: one writer at a time, so a single ``UPDATE … WHERE id IN (SELECT … LIMIT n)`` claims
    atomically; list parameters are expanded, uuids are text, batch writes use ``VALUES`` lists."""

    name = "sqlite"
    now_sql = "SELECT strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now') AS now"
    greatest = "MAX"
    row_lock = ""
    schemes = ("sqlite://",)
    row_locks = False
    pooled = False
    shared_by_processes = False
    local_file = True
    session_settings = False
    settle_statement = "PRAGMA wal_checkpoint(TRUNCATE)"

    url_defaults = {
        "journal_mode": "WAL",
        "synchronous": "NORMAL",
        "busy_timeout": "5000",
        # no checkpoint inside a commit: the process's Checkpointer copies the log back, off the
        # request path (oste.storage.checkpoints)
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

    def file_of(self, url: str) -> Path | None:
        parts = urlsplit(url)
        return Path(parts.netloc + parts.path) if parts.netloc else Path(parts.path)

    def encode_time(self, value: datetime) -> Any:
        return value.isoformat(" ")

    def placeholder(self, index: int) -> str:
        return "?"

    def encode_uuid(self, value: uuid.UUID) -> Any:
        return str(value)

    def in_list(self, column: str, values: Sequence[Any], params: Params, sql_type: str) -> str:
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
            f"UPDATE activity SET {_SET_COMPLETED.format(table='activity', now='?')} FROM v "
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


def _pg_completion_columns(completions: Sequence[Completion], now: datetime) -> list[Any]:
    """The parameters of ``_PG_COMPLETE``: one list per column of ``v``, then ``now``."""
    reports = [c.report for c in completions]
    return [
        [c.activity_id for c in completions],
        [c.claim_token for c in completions],
        [str(c.state) for c in completions],
        [c.retries for c in completions],
        [c.attempt for c in completions],
        [str(r.outcome) for r in reports],
        [c.next_attempt_at for c in completions],
        [c.finished_at for c in completions],
        [new_id() for _ in completions],
        [r.started_at for r in reports],
        [r.finished_at for r in reports],
        [r.duration_ms for r in reports],
        [r.http_status for r in reports],
        [r.error for r in reports],
        [r.response_excerpt for r in reports],
        [c.node for c in completions],
        now,
    ]


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


def _execution_values(execution_id: uuid.UUID, c: Completion) -> tuple[Any, ...]:
    report = c.report
    return (
        execution_id,
        c.activity_id,
        c.attempt,
        report.started_at,
        report.finished_at,
        report.duration_ms,
        str(report.outcome),
        report.http_status,
        report.error,
        report.response_excerpt,
        c.node,
    )


DRIVER_LOGGERS = ("asyncpg", "asyncpg.pool", "tortoise", "tortoise.db_client")
"""Loggers of the database drivers whose outage tracebacks are shortened to one line."""

SKIPPING_CHUNK = 500
"""Rows of one ``insert_rows_skipping`` statement."""

_KINDS: dict[str, type[Dialect]] = {"postgres": PostgresDialect, "sqlite": SqliteDialect}
_BUILT: dict[str, Dialect] = {}


def dialect_for_url(url: str) -> Dialect:
    """The Dialect of a database URL (``sqlite://PATH``, ``postgres://…``, ``postgresql://…``,
    ``asyncpg://…``), built once per process: ``open_database`` calls it, and every part then finds the
    same object through ``dialect_of``. Raises ``ValueError`` for any other scheme."""
    for dialect_type in _KINDS.values():
        if url.startswith(dialect_type.schemes):
            return _built(dialect_type)
    raise ValueError(f"a database URL must start with sqlite:// or postgres://, got {url!r}")


DATABASE_FILE = "oste.sqlite3"
"""The database file's name in the data directory when no database URL is given."""


MIGRATION_URL = "sqlite://./oste-makemigrations.sqlite3"
"""The scratch database ``tortoise makemigrations`` compares the models with."""


def database_file_url(directory: Path) -> str:
    """The URL of the default database: a file named ``DATABASE_FILE`` in ``directory``."""
    return file_url((directory / DATABASE_FILE).resolve())


def file_url(path: Path) -> str:
    """The URL of the database file at ``path``."""
    return f"{SqliteDialect.schemes[0]}{path}"


def dialect_of(conn: Any) -> Dialect:
    """The Dialect of an open connection (or a transaction on it): the one ``open_database`` built."""
    kind = conn.capabilities.dialect
    if kind not in _KINDS:
        raise ValueError(f"OSTE supports SQLite and PostgreSQL, not {kind!r}")
    return _built(_KINDS[kind])


def _built(dialect_type: type[Dialect]) -> Dialect:
    found = _BUILT.get(dialect_type.name)
    if found is None:
        found = _BUILT[dialect_type.name] = dialect_type()
    return found


# Decoders of raw statements' values, the same on both dialects (see ``Dialect``).
uuid_of = Dialect.uuid_of
optional_uuid_of = Dialect.optional_uuid_of
time_of = Dialect.time_of
optional_time_of = Dialect.optional_time_of
json_of = Dialect.json_of


PACE = 100
"""Rows a PostgreSQL COPY encodes between two pauses (``oste.eventloop.pause``): a 1,000-row batch
would otherwise hold the event loop for its whole encoding."""


async def _paced(rows: Sequence[Sequence[Any]]) -> AsyncIterator[Sequence[Any]]:
    """The rows for a COPY, with a pause every ``PACE``: still one statement, all rows or none."""
    for index, row in enumerate(rows):
        if index and index % PACE == 0:
            await pause()
        yield row
