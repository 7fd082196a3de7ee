"""PostgreSQL: the scale-out database, a server any number of OSTE processes share.

``PostgresDialect`` writes OSTE's statements for it and looks after how OSTE reaches it: the pool's
connection entry (its session settings and their check, ``postgres_sessions.py``; a primary and its
standbys, ``postgres_client.py``), connections of their own (the migration lock, an advisory lock held
by a transaction, and the read of the applied migrations; the LISTEN connection,
``postgres_listener.py``), the transaction guard (``transactions.py``), which of its driver's errors
are outages, and the refusal of ``oste backup`` with the tools to use instead.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from tortoise import connections
from tortoise.backends.base.client import BaseDBAsyncClient
from tortoise.backends.base.config_generator import expand_db_url
from tortoise.exceptions import DBConnectionError, IntegrityError
from tortoise.transactions import in_transaction

from oste.domain.claims import Completion
from oste.domain.ids import new_id
from oste.eventloop import pause
from oste.storage.dialects import postgres_listener, transactions
from oste.storage.dialects.admin import RECONNECT, BackupRefused, DriverOutage
from oste.storage.dialects.base import (
    EXECUTION_COLUMNS,
    SET_COMPLETED,
    Dialect,
    FollowOnWriter,
    Params,
    Placeholders,
    PreparedRows,
)
from oste.storage.dialects.postgres_sessions import (
    POSTGRES_SESSION,
    keep_session,
    warn_without_session_settings,
)

if TYPE_CHECKING:
    from oste.storage.dialects.sqlite_backup import Restored, Snapshot

log = logging.getLogger("oste.storage")

CLIENT = "oste.storage.dialects.postgres_client"
"""The Tortoise engine of a URL naming a primary and its standbys (``postgres_client.py``)."""
ADVISORY_LOCK_KEY = 0x6F737465_6D696772  # "ostemigr": one key for every OSTE database on a server
"""The PostgreSQL advisory lock that serialises migrations (per database: the key is scoped to it)."""
BACKUP_GUIDE = 'deploy/README.md, section "Backups and restore"'
"""Where operators read how to back a PostgreSQL database up and restore it."""


_PG_COMPLETE = (
    "WITH v AS (SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::int[], $5::int[], "
    "$6::text[], $7::timestamptz[], $8::timestamptz[], $9::uuid[], $10::timestamptz[], "
    "$11::timestamptz[], $12::float8[], $13::int[], $14::text[], $15::text[], $16::text[]) "
    "AS v(id, token, state, retries, attempts, outcome, next_at, finished_at, "
    "execution_id, started_at, ended_at, duration_ms, http_status, error, excerpt, node)), "
    "locked AS MATERIALIZED (SELECT l.id FROM (SELECT id, token FROM v ORDER BY id) k CROSS JOIN LATERAL "
    "(SELECT a.id FROM activity a WHERE a.id = k.id AND a.claim_token = k.token AND a.state = 'running' "
    "FOR UPDATE) l), "
    f"done AS (UPDATE activity SET {SET_COMPLETED.format(table='activity', now='$17')} "
    "FROM v WHERE activity.id = ANY(ARRAY(SELECT id FROM locked)) AND activity.id = v.id "
    "RETURNING activity.id) "
    f"INSERT INTO execution ({', '.join(name for name, _ in EXECUTION_COLUMNS)}) "
    "SELECT v.execution_id, v.id, v.attempts, v.started_at, v.ended_at, v.duration_ms, v.outcome, "
    "v.http_status, v.error, v.excerpt, v.node FROM v JOIN done ON done.id = v.id "
    "RETURNING activity_id"
)
"""Completions in one statement on PostgreSQL: the activities still claimed under their tokens get
their next state, and exactly those get their execution row. Each activity is found and locked by its
id alone, in id order (no deadlock between two writers), its token and state checked on the locked row;
the update then finds the locked ids through the primary key (an array the planner cannot size, so it
takes it as a few ids, not as a reason to scan the table). No part can be planned as a scan of every
running activity (the ``state`` index), which PostgreSQL chose when its statistics counted few running
(always, when they are read between bursts): a batch then read every claimed row to complete a few. One array
parameter per column of ``v`` (``_pg_completion_columns``): binary arrays cost the server less than
parsing the batch as JSON text, and in a scale-out deployment the server is what every worker shares."""


class PostgresDialect(Dialect):
    """PostgreSQL: ``FOR UPDATE SKIP LOCKED`` claims, array parameters, completions in one statement,
    batch inserts by binary ``COPY``."""

    name = "postgres"
    title = "PostgreSQL"
    url_form = "postgres://user@host:port/db"
    now_sql = "SELECT clock_timestamp() AS now"
    txid_sql = "pg_current_xact_id()::text::bigint"
    streamable_sql = "txid < pg_snapshot_xmin(pg_current_snapshot())::text::bigint"
    # Statistics taken before a burst was created count few due activities; the planner then reads
    # every due one (through a bitmap, or the whole table) and sorts them all to take a claim's few
    # hundred: each claim costs as much as the whole burst (20,000 due: 14 ms a claim of 500 against
    # 5 ms walking the index). Without sorts, the one plan left walks the due index in order.
    due_in_order_sql = "SET LOCAL enable_sort = off"
    schemes = ("postgres://", "postgresql://", "asyncpg://")
    settle_statement = "VACUUM (ANALYZE) activity"
    driver_errors = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError)
    server_errors = (asyncpg.PostgresError,)

    url_defaults = {"minsize": "1", "maxsize": "20"}

    def describe(self, url: str) -> str:
        parts = urlsplit(url)
        hosts = parts.netloc.rpartition("@")[2] or "localhost"
        if "," not in hosts and ":" not in hosts.rpartition("]")[2]:
            hosts += ":5432"
        return f"PostgreSQL {hosts}{parts.path}"

    def connection_identity(self, client: Any) -> tuple[Any, ...]:
        # str(): a client given a list of hosts (``postgres_client``) holds lists
        return (self.name, str(client.host), str(client.port), client.user, client.database, client.schema)

    # --- connections -------------------------------------------------------------------------------

    def connection_config(self, url: str, command_timeout: float | None = None) -> dict[str, Any]:
        # Tortoise's expanded form, with the pool's release hook (``keep_session``), the session
        # settings (``POSTGRES_SESSION``) and, when given, the limit on one statement's answer.
        normal = self.normalise_url(url)
        parts = urlsplit(normal)
        credentials, _, hosts = parts.netloc.rpartition("@")
        if "," in hosts:  # a primary and its standbys: Tortoise's parser takes one host, ours keeps them all
            first = urlunsplit(
                parts._replace(netloc=f"{credentials}@localhost" if credentials else "localhost")
            )
            expanded = expand_db_url(first)
            expanded["engine"] = CLIENT
            expanded["credentials"]["host"] = hosts
            expanded["credentials"]["port"] = 5432
        else:
            expanded = expand_db_url(normal)
        expanded["credentials"]["reset"] = keep_session
        expanded["credentials"]["server_settings"] = dict(POSTGRES_SESSION)
        if command_timeout is not None:
            expanded["credentials"]["command_timeout"] = command_timeout
        return expanded

    def direct_arguments(self, url: str) -> dict[str, Any]:
        """``asyncpg.connect`` keyword arguments for a connection of its own to the database at ``url``
        (outside the pool: the migration lock, the schema check, the LISTEN connection): its host or
        host list, port(s), credentials, database and ``target_session_attrs``, without the pool's
        settings."""
        config = self.connection_config(url)
        credentials = config["credentials"]
        if config["engine"] == CLIENT:
            from oste.storage.dialects.postgres_client import parse_hosts  # loads Tortoise's asyncpg client

            host, port = parse_hosts(credentials["host"])
        else:
            host, port = credentials["host"], credentials["port"]
        wanted = ("user", "password", "database", "ssl", "target_session_attrs")
        return {
            "host": host,
            "port": port,
            **{k: credentials[k] for k in wanted if credentials.get(k) is not None},
        }

    def guard_transactions(self) -> None:
        transactions.guard_pooled_entry()

    async def opened(self, url: str) -> None:
        # A pooler may drop the session settings: say so, naming the statements that set them.
        await warn_without_session_settings(urlsplit(url).username)

    # --- the schema's administration ----------------------------------------------------------------

    async def read_migrations(self, url: str, app: str, table: str) -> list[str]:
        # no statement cache: a named statement could land on another server connection behind PgBouncer
        connection = await asyncpg.connect(**self.direct_arguments(url), statement_cache_size=0)
        try:
            if await connection.fetchval("SELECT to_regclass($1)", table) is None:
                return []
            rows = await connection.fetch(f"SELECT name FROM {table} WHERE app = $1", app)
            return [row["name"] for row in rows]
        finally:
            await connection.close()

    def migration_lock(self, url: str, where: str) -> AbstractAsyncContextManager[None]:
        return _advisory_lock(self.direct_arguments(url), where)

    async def backup(self, url: str, path: Path, force: bool = False) -> Snapshot:
        raise BackupRefused(
            _refusal(
                "backup",
                "take a PostgreSQL backup with `pg_dump -Fc DBNAME > oste.dump` (consistent while OSTE "
                "runs) or a base backup with WAL archiving for point-in-time recovery",
            )
        )

    async def restore(self, url: str, backup_file: Path) -> Restored:
        raise BackupRefused(
            _refusal(
                "restore",
                "restore a `pg_dump -Fc` dump with `pg_restore -d DBNAME oste.dump` into a new database",
            )
        )

    # --- outages and notices -----------------------------------------------------------------------

    @staticmethod
    def outage_of(exc: BaseException, where: str) -> DriverOutage | None:
        if isinstance(exc, asyncpg.PostgresConnectionError) or (
            isinstance(exc, asyncpg.OperatorInterventionError)
            and not isinstance(exc, asyncpg.QueryCanceledError)
        ):
            return DriverOutage("the database closed or refused the connection", RECONNECT)
        if isinstance(exc, asyncpg.InterfaceError) and "closed" in str(exc):
            return DriverOutage("the database connection was lost", RECONNECT)
        if isinstance(exc, asyncpg.InternalClientError) and "another operation" in str(exc):
            # a connection whose server died mid-statement, still marked busy by the statement it lost
            return DriverOutage("the database connection was lost", RECONNECT)
        if isinstance(exc, asyncpg.DiskFullError):
            return DriverOutage(
                "the database server's disk is full", _ACTIONS["disk-full"], full_disk=str(exc).strip()
            )
        if isinstance(exc, asyncpg.InsufficientResourcesError):
            return DriverOutage("the database server is out of resources", _ACTIONS["resources"])
        if isinstance(exc, asyncpg.ReadOnlySQLTransactionError):
            return DriverOutage("the database is read-only", _ACTIONS["read-only"])
        return None

    async def notify(self, client: Any, channel: str, payloads: Sequence[str]) -> None:
        await client.execute_query(
            f"SELECT pg_notify('{channel}', payload) FROM unnest($1::text[]) AS payload", [list(payloads)]
        )

    def listening(
        self, connection: str, url: str | None, channel: str, notified: Callable[[str], None]
    ) -> AbstractAsyncContextManager[asyncio.Event]:
        direct = self.direct_arguments(url) if url is not None else None
        return postgres_listener.listening(connection, direct, channel, notified)

    # --- statements --------------------------------------------------------------------------------

    def cast(self, sql_type: str) -> str:
        return f"::{sql_type}"

    def placeholder(self, index: int) -> str:
        return f"${index}"

    def in_list(self, column: str, values: Sequence[Any], params: Placeholders, sql_type: str) -> str:
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
        # A few rows (a single create) go in one INSERT instead: a COPY is two round trips (the
        # driver reads the columns' types first), an INSERT's prepared statement is cached.
        rows = prepared.records
        records = _paced(rows) if len(rows) > PACE else rows
        async with _raw(conn) as raw:
            if len(rows) <= VALUES_ROWS:
                sql = _values_insert(prepared.table, prepared.names, len(rows))
                await raw.execute(sql, *[value for row in rows for value in row])
            else:
                await raw.copy_records_to_table(prepared.table, records=records, columns=prepared.names)

    gated_inserts = True

    async def insert_gated(
        self,
        conn: BaseDBAsyncClient,
        gate: str,
        params: Params,
        inserts: Sequence[tuple[str, Sequence[tuple[str, str]], Sequence[Sequence[Any]]]],
    ) -> bool:
        # WITH gate AS (…), i0 AS (INSERT … SELECT u.* FROM gate, unnest($…::uuid[], …) AS u), …:
        # each insert reads the gate's row (so none runs without it), a column's values go as one
        # array of its type (one statement text whatever the number of rows: prepared once per
        # connection), and the whole is one round trip in one implicit transaction
        parts = [f"gate AS ({gate})"]
        for index, (table, columns, rows) in enumerate(inserts):
            names = ", ".join(f'"{name}"' for name, _ in columns)
            arrays = ", ".join(
                f"{params.add([row[i] for row in rows])}::{_array_type(sql_type)}"
                for i, (_, sql_type) in enumerate(columns)
            )
            rows_in = f"SELECT u.* FROM gate, unnest({arrays}) AS u"
            parts.append(f'i{index} AS (INSERT INTO "{table}" ({names}) {rows_in})')
        sql = "WITH " + ", ".join(parts) + " SELECT count(*) FROM gate"
        async with _raw(conn) as raw:
            return bool(await raw.fetchval(sql, *params.values))


def _array_type(sql_type: str) -> str:
    """The cast of a column's values sent as one array (JSON goes as text, as ``json_param`` sends it)."""
    return "text[]::jsonb[]" if sql_type == "jsonb" else f"{sql_type}[]"


@asynccontextmanager
async def _raw(conn: BaseDBAsyncClient) -> AsyncIterator[Any]:
    """The driver's connection under ``conn``, its errors as Tortoise's: IntegrityError (a constraint;
    nothing was written) and DBConnectionError (the connection was lost)."""
    try:
        async with conn.acquire_connection() as raw:
            yield raw
    except asyncpg.IntegrityConstraintViolationError as exc:
        raise IntegrityError(str(exc)) from exc
    except (OSError, asyncpg.InterfaceError, asyncpg.ConnectionDoesNotExistError) as exc:
        raise DBConnectionError(str(exc)) from exc


VALUES_ROWS = 8
"""Rows at most that ``insert_prepared`` writes with an INSERT rather than a COPY."""


@functools.lru_cache(maxsize=64)
def _values_insert(table: str, names: tuple[str, ...], count: int) -> str:
    """``INSERT INTO table (names) VALUES (…), …`` for ``count`` rows of positional parameters."""
    width = len(names)
    rows = (
        "(" + ", ".join(f"${row * width + column + 1}" for column in range(width)) + ")"
        for row in range(count)
    )
    columns = ", ".join(f'"{name}"' for name in names)
    return f'INSERT INTO "{table}" ({columns}) VALUES {", ".join(rows)}'


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


PACE = 100
"""Rows a PostgreSQL COPY encodes between two pauses (``oste.eventloop.pause``): a 1,000-row batch
would otherwise hold the event loop for its whole encoding."""


async def _paced(rows: Sequence[Sequence[Any]]) -> AsyncIterator[Sequence[Any]]:
    """The rows for a COPY, with a pause every ``PACE``: still one statement, all rows or none."""
    for index, row in enumerate(rows):
        if index and index % PACE == 0:
            await pause()
        yield row


_ACTIONS = {
    "disk-full": "free space on the database server's data volume (the tablespace named above); OSTE "
    "resumes by itself once there is room.",
    "resources": "the database server is out of connections, memory or disk; raise its limits or "
    "lower OSTE's pool size (maxsize in OSTE_DATABASE_URL).",
    "read-only": "the database refuses writes (a standby after a failover?); point OSTE_DATABASE_URL "
    "at the primary.",
}
"""What an operator does about each kind of PostgreSQL outage (besides a lost connection: ``RECONNECT``)."""


def _refusal(command: str, advice: str) -> str:
    return f"`oste {command}` copies the embedded SQLite database only; {advice}: see {BACKUP_GUIDE}"


@asynccontextmanager
async def _advisory_lock(arguments: dict[str, Any], where: str) -> AsyncIterator[None]:
    connection = await asyncpg.connect(**arguments, statement_cache_size=0)
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
