"""The one writer of activity rows: every path that creates activities ends here.

The API, the UI and ``oste import`` (``insert_activities``, from ``NewActivity`` items), a recurring
activity's occurrences, backfills and run-now (``oste.storage.occurrences``), follow-ons and dead-letter
handlers (``oste.storage.chains``) build each activity's record and hand the records to
``write_activities``, which turns each record into one row (``_row``: a new column is added here once)
and records each new activity's ``created`` event in the insert's transaction.

One multi-row INSERT per batch, built from the records without ORM instances.

Building a Tortoise model instance per activity for ``bulk_create`` cost more than validating it; here
each activity becomes one tuple of column values and the dialect's ``insert_rows`` writes the batch in a
single statement (PostgreSQL: ``INSERT … SELECT * FROM unnest(…)``; SQLite: ``executemany``), which is
atomic on its own. Values are encoded as Tortoise encodes them (uuids, aware UTC datetimes, JSON as
orjson text), so the rows read back through the models exactly as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import orjson
from tortoise.backends.base.client import BaseDBAsyncClient, TransactionalDBClient
from tortoise.exceptions import DBConnectionError, IntegrityError
from tortoise.transactions import in_transaction

from oste.domain import records as r
from oste.domain.audit import AuditEntry
from oste.domain.ids import new_id
from oste.errors import Conflict, Unavailable
from oste.eventloop import pause, write_turn
from oste.storage import models as m
from oste.storage.audit_rows import TYPED_COLUMNS as AUDIT_COLUMNS
from oste.storage.audit_rows import audit_values
from oste.storage.create_groups import CreateGroups
from oste.storage.dialects import Params, PreparedRows, dialect_of
from oste.storage.events import (
    Change,
    record,
    record_staged_statement,
    record_statement,
    subscribed_solutions,
)
from oste.storage.quotas import RoomGate, room_gate

COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "uuid"),
    ("company_id", "uuid"),
    ("solution_id", "uuid"),
    ("activity_type_id", "uuid"),
    ("partition", "smallint"),
    ("scheduled_for", "timestamptz"),
    ("next_attempt_at", "timestamptz"),
    ("parameter", "jsonb"),
    ("retries", "int"),
    ("priority", "int"),
    ("object_id", "text"),
    ("state", "text"),
    ("attempts", "int"),
    ("recurring_activity_id", "uuid"),
    ("occurrence_at", "timestamptz"),
    ("idempotency_key", "text"),
    ("request_hash", "text"),
    ("created_at", "timestamptz"),
    ("updated_at", "timestamptz"),
    ("caused_by", "uuid"),
    ("depth", "int"),
    ("off_schedule", "bool"),
    ("expires_at", "timestamptz"),
    ("labels", "jsonb"),
    ("traceparent", "text"),
    ("tracestate", "text"),
)
"""The columns a new activity sets, with their PostgreSQL types; the others start NULL."""
LABEL_COLUMNS: tuple[tuple[str, str], ...] = (
    ("activity_id", "uuid"),
    ("solution_id", "uuid"),
    ("key", "text"),
    ("value", "text"),
)
"""An activity's label rows (``activity_label``: what a label filter reads through its index)."""

CONFLICT = "an activity with the same idempotency key or occurrence already exists"

YIELD_EVERY = 25
"""Rows ``insert_activities`` builds between two yields to the event loop."""


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is UTC else value.astimezone(UTC)


def new_activity_record(
    item: r.NewActivity, now: datetime, type_partition: tuple[int, bool] | None = None
) -> r.Activity:
    """The record of a new activity as it will be stored (a fresh id; due at its ``scheduled_for``).

    ``type_partition``: its type's (partition, limited), when the caller has it at hand; the activity's
    own partition follows from it (``activity_partition``).
    """
    activity_type = item.activity_type
    due = _utc(item.scheduled_for)
    activity_id = new_id()
    partition, limited = (
        (activity_type.partition, activity_type.limited) if type_partition is None else type_partition
    )
    return r.Activity(
        id=activity_id,
        company_id=activity_type.company_id,
        solution_id=activity_type.solution_id,
        activity_type_id=activity_type.id,
        activity_type=activity_type.name,
        partition=r.activity_partition(activity_id, partition, limited),
        scheduled_for=due,
        next_attempt_at=due,
        parameter=item.parameter,
        retries=item.retries,
        priority=item.priority,
        object_id=item.object_id,
        state=r.ActivityState.SCHEDULED,
        attempts=0,
        last_outcome=None,
        recurring_activity_id=item.recurring_activity_id,
        occurrence_at=_utc(item.occurrence_at) if item.occurrence_at else None,
        idempotency_key=item.idempotency_key,
        created_at=now,
        updated_at=now,
        finished_at=None,
        expires_at=_utc(item.expires_at) if item.expires_at else None,
        labels=item.labels or None,
        traceparent=item.traceparent,
        tracestate=item.tracestate,
    )


def _row(a: r.Activity, request_hash: str | None, off_schedule: bool = False) -> tuple[Any, ...]:
    """The values of ``COLUMNS`` for one activity (``off_schedule``: an occurrence made by run-now, a
    backfill or the backlog, not counted in its schedule's runs)."""
    return (
        a.id,
        a.company_id,
        a.solution_id,
        a.activity_type_id,
        a.partition,
        a.scheduled_for,
        a.next_attempt_at,
        orjson.dumps(a.parameter).decode(),
        a.retries,
        a.priority,
        a.object_id,
        r.ActivityState.SCHEDULED.value,
        0,
        a.recurring_activity_id,
        a.occurrence_at,
        a.idempotency_key,
        request_hash,
        a.created_at,
        a.updated_at,
        a.caused_by,
        a.depth,
        True if off_schedule else None,
        a.expires_at,
        orjson.dumps(a.labels).decode() if a.labels else None,
        a.traceparent,
        a.tracestate,
    )


@dataclass(frozen=True)
class PreparedActivities:
    """New activities made ready before the transaction that writes them opens (``prepare_activities``):
    their records, their rows with every value encoded and the statements built, and the statement of
    their ``created`` events (the streamed solutions'). The transaction then only runs the statements."""

    created: tuple[r.Activity, ...]
    rows: PreparedRows
    events: tuple[str, list[Any]] | None
    labelled: tuple[r.Activity, ...] = ()
    """The activities with labels (their ``activity_label`` rows are written with them)."""


async def prepare_activities(new: Sequence[r.NewActivity], now: datetime) -> PreparedActivities:
    """Build what inserting ``new`` takes (records with fresh ids, encoded rows, the insert and event
    statements) without holding a transaction; ``write_prepared`` writes it. Outside a transaction a
    big batch pauses every ``YIELD_EVERY`` rows (``oste.eventloop.pause``: an API heavy request lets the
    light requests in flight finish first), stages its rows on SQLite (``Dialect.stage_rows``), and ends
    with ``oste.eventloop.write_turn`` (an API heavy request waits for a pause in light requests);
    inside a transaction on SQLite only a plain yield, as that transaction holds the one connection
    those requests would wait for."""
    now = _utc(now)
    db = m.Activity._meta.db
    dialect = dialect_of(db)
    yielding = dialect.pooled or not isinstance(db, TransactionalDBClient)
    partitions = {
        activity_type.id: (activity_type.partition, activity_type.limited)
        for activity_type in {item.activity_type.id: item.activity_type for item in new}.values()
    }
    created: list[r.Activity] = []
    rows: list[tuple[Any, ...]] = []
    for index, item in enumerate(new):
        if index and index % YIELD_EVERY == 0:
            await (pause() if yielding else asyncio.sleep(0))
        created.append(new_activity_record(item, now, partitions[item.activity_type.id]))
        rows.append(_row(created[-1], item.request_hash))
    streamed = await subscribed_solutions(now) if created else frozenset()
    wanted = [Change(a.id, "created") for a in created if a.solution_id in streamed]
    if yielding:  # outside a transaction: on SQLite the rows wait in a staging table
        prepared_rows = await dialect.stage_rows(db, "activity", COLUMNS, rows)
        await pause()
    else:
        prepared_rows = dialect.prepare_rows("activity", COLUMNS, rows)
    if not wanted:
        events = None
    elif prepared_rows.staged is not None and len(wanted) == len(created):
        events = record_staged_statement(dialect, prepared_rows.staged, "created", now)
    else:
        events = record_statement(dialect, wanted, now)
    if yielding:  # the write is the one step that cannot pause: light requests go first
        await write_turn()
    labelled = tuple(a for a in created if a.labels)
    return PreparedActivities(tuple(created), prepared_rows, events, labelled)


async def write_prepared(prepared: PreparedActivities) -> list[r.Activity]:
    """Write what ``prepare_activities`` built, all or nothing (in the caller's transaction when there
    is one); the records, in the order given. Raises Conflict if an idempotency key or a recurring
    occurrence already exists (nothing is written then) and Unavailable when the database cannot be
    reached."""
    if not prepared.created:
        return []
    # the rows, their labels and their created events, or none; the rows alone are one statement,
    # atomic on its own (a transaction, or the caller's savepoint, would cost two more round trips)
    alone = not prepared.labelled and prepared.events is None
    try:
        async with contextlib.nullcontext(m.Activity._meta.db) if alone else in_transaction() as tx:
            await dialect_of(tx).insert_prepared(tx, prepared.rows)
            if prepared.labelled:
                await _insert_labels(tx, list(prepared.labelled), None)
            if prepared.events is not None:
                await tx.execute_query(*prepared.events)
    except IntegrityError:
        raise Conflict(CONFLICT) from None
    except DBConnectionError as exc:
        raise Unavailable(f"the database is unreachable: {exc}") from None
    finally:
        db = m.Activity._meta.db
        await dialect_of(db).discard_staged(db, prepared.rows)
    return list(prepared.created)


@dataclass(frozen=True)
class AtOnce:
    """What a single create writes beside its activity when the database takes both in one statement
    (``write_at_once``): its audit row, built for the new activity's id, and its room under the
    company's quota."""

    audit: Callable[[uuid.UUID], AuditEntry]
    room: RoomGate


async def write_at_once(item: r.NewActivity, now: datetime, also: AtOnce) -> r.Activity | None:
    """Insert one new activity, its audit row and its room under the company's quota in one statement
    (one round trip, where a transaction takes five: BEGIN, the three statements, COMMIT; the company's
    row is held for that statement only); its record. None when it cannot, with nothing written: the
    dialect has no such statement (SQLite), a transaction is open already, the activity has labels or an
    idempotency key (a key's twin in flight would be waited for while the company's row is held), its
    solution's events are streamed, or the quota's bound alone does not show room (the caller then
    writes it the usual way, which counts and refuses). Raises Unavailable when the database cannot
    be reached. Concurrent ones of one company go together (``oste.storage.create_groups``): one
    statement, one flush, one hold of the company's row for all of them."""
    db = m.Activity._meta.db
    dialect = dialect_of(db)
    if not dialect.gated_inserts or isinstance(db, TransactionalDBClient):
        return None
    if item.labels or item.idempotency_key is not None:
        return None
    now = _utc(now)
    created = new_activity_record(item, now)
    if created.solution_id in await subscribed_solutions(now):
        return None
    rows = (_row(created, item.request_hash), audit_values(also.audit(created.id)))
    key = (id(db), also.room)

    async def write(group: list[tuple[tuple[Any, ...], list[Any]]]) -> bool:
        params = Params(dialect)
        gate = room_gate(params, replace(also.room, adding=also.room.adding * len(group)))
        activities: list[Sequence[Any]] = [activity for activity, _ in group]
        audits: list[Sequence[Any]] = [audit for _, audit in group]
        inserts = [("activity", COLUMNS, activities), ("audit", AUDIT_COLUMNS, audits)]
        try:
            return await dialect.insert_gated(db, gate, params, inserts)
        except IntegrityError:
            raise Conflict(CONFLICT) from None  # a fresh id and no key: only a vanished type or solution
        except DBConnectionError as exc:
            raise Unavailable(f"the database is unreachable: {exc}") from None

    written = await _GROUPS.write(key, rows, write)
    return created if written else None


GROUP_MOST = 64
"""Single creates of one company at most in one statement (``oste.storage.create_groups``)."""
_GROUPS: CreateGroups[tuple[tuple[Any, ...], list[Any]]] = CreateGroups(GROUP_MOST)


async def insert_activities(new: Sequence[r.NewActivity], now: datetime) -> list[r.Activity]:
    """Insert validated activities all-or-nothing in one statement, in the order given; their records
    (``prepare_activities`` then ``write_prepared``).

    Raises Conflict if an idempotency key or a recurring occurrence already exists (nothing is written
    then) and Unavailable when the database cannot be reached.
    """
    if not new:
        return []
    return await write_prepared(await prepare_activities(new, now))


async def write_activities(
    records: Sequence[r.Activity],
    now: datetime,
    *,
    off_schedule: Sequence[bool] | None = None,
    skip_existing: bool = False,
    conn: BaseDBAsyncClient | None = None,
    subscribed: frozenset[uuid.UUID] | None = None,
    conflict: str = CONFLICT,
) -> list[r.Activity]:
    """Insert activities built by the caller (occurrences, follow-ons, handlers) as ``insert_activities``
    inserts new ones; returns the records of the rows written.

    ``skip_existing``: an activity whose idempotency key or occurrence exists already is left out (its
    row is not written and it gets no event) instead of raising Conflict. ``conn``: the transaction to
    write in (default: the current one, if any); ``subscribed``: the streamed solutions, when the caller
    has read them already. Raises Conflict (``conflict``) for an existing key without
    ``skip_existing``, and Unavailable when the database cannot be reached.
    """
    if not records:
        return []
    flags = off_schedule or [False] * len(records)
    rows = [_row(a, None, flag) for a, flag in zip(records, flags, strict=True)]
    return await _write(list(records), rows, _utc(now), conn, subscribed, skip_existing, conflict)


async def _write(
    created: list[r.Activity],
    rows: list[tuple[Any, ...]],
    now: datetime,
    conn: BaseDBAsyncClient | None,
    subscribed: frozenset[uuid.UUID] | None,
    skip_existing: bool,
    conflict: str,
) -> list[r.Activity]:
    """Write the rows and the created events of the streamed solutions' activities, all or nothing."""
    streamed = subscribed if subscribed is not None else await subscribed_solutions(now)
    wanted = [Change(a.id, "created") for a in created if a.solution_id in streamed]
    labelled = [a for a in created if a.labels]
    try:
        if (wanted or labelled) and conn is None:
            async with in_transaction():  # the rows, their labels and their created events, or none
                written = await _insert_rows(m.Activity._meta.db, rows, skip_existing)
                await _insert_labels(m.Activity._meta.db, labelled, written)
                await _record_created(m.Activity._meta.db, wanted, written, now)
        else:
            db = conn if conn is not None else m.Activity._meta.db  # the current transaction's, if any
            written = await _insert_rows(db, rows, skip_existing)
            await _insert_labels(db, labelled, written)
            await _record_created(db, wanted, written, now)
    except IntegrityError:
        raise Conflict(conflict) from None
    except DBConnectionError as exc:
        raise Unavailable(f"the database is unreachable: {exc}") from None
    return created if written is None else [a for a in created if a.id in written]


async def _insert_rows(
    conn: BaseDBAsyncClient, rows: list[tuple[Any, ...]], skip_existing: bool
) -> set[uuid.UUID] | None:
    """Insert the rows; with ``skip_existing`` the ids written (None: every row was)."""
    dialect = dialect_of(conn)
    if skip_existing:
        return await dialect.insert_rows_skipping(conn, "activity", COLUMNS, rows)
    await dialect.insert_rows(conn, "activity", COLUMNS, rows)
    return None


async def _insert_labels(
    conn: BaseDBAsyncClient, labelled: list[r.Activity], written: set[uuid.UUID] | None
) -> None:
    """One ``activity_label`` row per label of each activity written."""
    rows = [
        (a.id, a.solution_id, key, value)
        for a in labelled
        if written is None or a.id in written
        for key, value in (a.labels or {}).items()
    ]
    if rows:
        await dialect_of(conn).insert_rows(conn, "activity_label", LABEL_COLUMNS, rows)


async def _record_created(
    conn: BaseDBAsyncClient, wanted: list[Change], written: set[uuid.UUID] | None, now: datetime
) -> None:
    if written is not None:
        wanted = [change for change in wanted if change.activity_id in written]
    if wanted:
        await record(conn, dialect_of(conn), wanted, now)
