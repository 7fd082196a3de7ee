"""The ``Dialect``: how OSTE's statements are written on one database, and the one of the open database.

Every statement OSTE writes in SQL (claims, completions, batch inserts, the event stream, statistics,
log shipping, bulk changes, the overview) takes its placeholders, casts, value encodings, row locking
and dialect-specific functions from the open database's ``Dialect``, or from a ``Query`` built on it.
``open_database`` builds that one Dialect (``dialect_for_url``) and records it here
(``record_open``); every part finds it through ``dialect_of(connection)`` (``Storage.dialect``
outside), and ``close_database`` forgets it (``forget_open``). What a dialect does around its
statements (URLs, connecting, locks, backups, outages, notices) is its ``DialectAdmin`` side
(``admin.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson
from tortoise import connections
from tortoise.backends.base.client import BaseDBAsyncClient
from tortoise.transactions import in_transaction

from oste.domain.claims import Completion
from oste.domain.ids import new_id
from oste.storage.dialects.admin import DialectAdmin

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
"""The execution table's columns with their PostgreSQL types, in ``execution_values`` order."""

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


class Placeholders(Protocol):
    """What hands out a statement's placeholders in order (``Params``, ``Query``)."""

    def add(self, value: Any) -> str: ...


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
        """``column`` among ``ids``: on PostgreSQL one array parameter (``Dialect.in_list``), so the
        statement's text is the same for any number of ids, prepared and planned once per connection
        (a list of placeholders made a new statement for every length: parsed and planned again, its
        catalog reads included, about 1.4 ms for 75 ids, where running it took 0.6 ms)."""
        if not ids:
            return "1 = 0"
        return self.strategy.in_list(column, [self.strategy.encode_uuid(i) for i in ids], self, "uuid")

    async def rows(self, sql: str) -> list[dict[str, Any]]:
        return list(await self.conn.execute_query_dict(sql, self.values))


class Dialect(DialectAdmin):
    """The statements' side of a dialect, shared by both; ``SqliteDialect`` and ``PostgresDialect``
    fill in the differences."""

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
    row_locks = True
    """True where writers lock rows (PostgreSQL: lock them in a fixed order, ``FOR KEY SHARE`` where a
    read must not wait); False where the one writer holds the whole database (SQLite)."""
    pooled = True
    """True where a pool of connections lets other requests run while a transaction holds one (several
    completion batches write at once, a big insert pauses for others); False where the process has one
    connection and a transaction holds it (SQLite)."""
    gated_inserts = False
    """True where ``insert_gated`` writes rows of several tables in one statement behind a gate
    (PostgreSQL's data-modifying ``WITH``); False where the caller writes them in a transaction."""
    settle_statement = ""
    """What ``settle_after_bulk_load`` runs: the work the database would have done in the background."""
    due_in_order_sql = ""
    """Run in a claim's transaction before its pick (empty: nothing to run, no transaction needed): what
    makes the database walk the due index in due order and stop at the claim's limit, whatever its
    statistics say of how many are due."""

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

    def in_list(self, column: str, values: Sequence[Any], params: Placeholders, sql_type: str) -> str:
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
            rows = [execution_values(new_id(), c) for c in completions if c.activity_id in ids]
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

    async def insert_gated(
        self,
        conn: BaseDBAsyncClient,
        gate: str,
        params: Params,
        inserts: Sequence[tuple[str, Sequence[tuple[str, str]], Sequence[Sequence[Any]]]],
    ) -> bool:
        """Where ``gated_inserts``: insert ``inserts``' rows (table, its columns with their types, the
        rows' values in that order) in one statement, atomic on its own, if and only if the ``gate``
        (a statement answering at most one row, its placeholders taken from ``params`` first) answers
        one; whether it did. Raises IntegrityError (nothing is written) and DBConnectionError as the
        drivers' do."""
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


SET_COMPLETED = (
    "state = v.state, retries = v.retries, last_outcome = v.outcome, "
    # a snoozed or expired attempt is recorded (its execution) but not counted: no request, or the
    # receiver's own "later"
    "attempts = CASE WHEN v.outcome IN ('snoozed', 'expired') THEN v.attempts - 1 ELSE v.attempts END, "
    "snoozes = CASE WHEN v.outcome = 'snoozed' THEN {table}.snoozes + 1 ELSE {table}.snoozes END, "
    "next_attempt_at = COALESCE(v.next_at, {table}.next_attempt_at), finished_at = v.finished_at, "
    "claimed_by = NULL, claim_token = NULL, lease_expires_at = NULL, updated_at = {now}"
)


def execution_values(execution_id: uuid.UUID, c: Completion) -> tuple[Any, ...]:
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


SKIPPING_CHUNK = 500
"""Rows of one ``insert_rows_skipping`` statement."""


_OPEN: list[Dialect] = []
"""The open database's Dialect (``record_open``); empty while no database is open."""


def record_open(dialect: Dialect) -> None:
    """Record ``dialect`` as the open database's, the one every part then finds (``open_database``,
    once the ORM is connected)."""
    _OPEN[:] = [dialect]


def forget_open() -> Dialect | None:
    """Forget the open database's Dialect (``close_database``); it, or None when none was open."""
    return _OPEN.pop() if _OPEN else None


def dialect_of(conn: Any) -> Dialect:
    """The Dialect of the open database, for a connection to it (or a transaction on it): the one
    ``open_database`` built and recorded. Raises ``RuntimeError`` when no database is open, or when
    ``conn`` is a connection to a database of another kind."""
    if not _OPEN:
        raise RuntimeError("no database is open: open_database builds its Dialect first")
    dialect = _OPEN[0]
    kind = conn.capabilities.dialect
    if kind != dialect.name:
        raise RuntimeError(f"the open database is {dialect.title}, but this connection is to {kind!r}")
    return dialect


# Decoders of raw statements' values, the same on both dialects (see ``Dialect``).
uuid_of = Dialect.uuid_of
optional_uuid_of = Dialect.optional_uuid_of
time_of = Dialect.time_of
optional_time_of = Dialect.optional_time_of
json_of = Dialect.json_of
