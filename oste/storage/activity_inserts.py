"""Creating activities: multi-row INSERTs built from the records without ORM instances.

Building a Tortoise model instance per activity for ``bulk_create`` cost more than validating it; here
each activity becomes one tuple of column values, and the dialect writes the batch in as few statements
as it can (``ClaimStrategy.prepare_rows``; PostgreSQL: one binary COPY; SQLite: one multi-row INSERT
per thousand rows). Values are encoded as Tortoise encodes them (uuids, aware UTC datetimes, JSON as
orjson text), so the rows read back through the models exactly as before.

Everything is built before the insert's transaction opens — the records, the rows' encoded values and
statements, the ``created`` events' statement — so the transaction holds only those statements, what
the caller adds (its audit row, its quota) and the commit: on SQLite, a thousand-item batch's turn on
the one connection every other request shares.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
from tortoise.backends.base.client import TransactionalDBClient
from tortoise.exceptions import DBConnectionError, IntegrityError
from tortoise.transactions import in_transaction

from oste.domain import records as r
from oste.domain.ids import new_id
from oste.errors import Conflict, Unavailable
from oste.eventloop import pause
from oste.storage import models as m
from oste.storage.dialects import ClaimStrategy, strategy_for
from oste.storage.events import Change, record_statement, subscribed_solutions

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
)
"""The columns a new activity sets, with their PostgreSQL types; the others start NULL."""

YIELD_EVERY = 25
"""Rows ``insert_activities`` builds between two yields to the event loop."""

_STRATEGIES: dict[str, ClaimStrategy] = {}


def _strategy(dialect: str) -> ClaimStrategy:
    if dialect not in _STRATEGIES:
        _STRATEGIES[dialect] = strategy_for(dialect)
    return _STRATEGIES[dialect]


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is UTC else value.astimezone(UTC)


def new_activity_record(
    item: r.NewActivity, now: datetime, type_partition: tuple[int, bool] | None = None
) -> r.Activity:
    """The record of a new activity as it will be stored (a fresh id; due at its ``scheduled_for``).

    ``type_partition``: its type's (partition, limited), when the caller has it at hand; the activity's
    own partition follows from it (``activity_partition``).
    """
    kind = item.activity_type
    due = _utc(item.scheduled_for)
    activity_id = new_id()
    partition, limited = (kind.partition, kind.limited) if type_partition is None else type_partition
    return r.Activity(
        id=activity_id,
        company_id=kind.company_id,
        solution_id=kind.solution_id,
        activity_type_id=kind.id,
        activity_type=kind.name,
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
    )


def _row(a: r.Activity, request_hash: str | None) -> tuple[Any, ...]:
    """The values of ``COLUMNS`` for one activity."""
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
    )


async def insert_activities(
    new: Sequence[r.NewActivity],
    now: datetime,
    then: Callable[[list[r.Activity]], Awaitable[None]] | None = None,
) -> list[r.Activity]:
    """Insert validated activities all-or-nothing, in the order given, with their ``created`` events
    (when their solution is streamed); their records. ``then`` runs in the same transaction once the
    rows are in (an operation's audit row and quota): what it raises writes nothing.

    Every row, its event and their statements are built before the transaction opens, so the
    transaction holds only the statements and the commit (on SQLite it holds the one connection every
    other request waits for). Raises Conflict if an idempotency key or a recurring occurrence already
    exists (nothing is written then) and Unavailable when the database cannot be reached.
    """
    if not new:
        return []
    now = _utc(now)
    db = m.Activity._meta.db  # the caller's transaction's connection, if it holds one
    strategy = _strategy(db.capabilities.dialect)
    # build in chunks that let other requests run meanwhile; on SQLite, with only a plain yield when
    # the caller's transaction holds the one connection those requests would wait for
    shared = strategy.name != "sqlite" or not isinstance(db, TransactionalDBClient)
    created, rows = await _built(new, now, pause if shared else _yield)
    prepared = strategy.prepare_rows("activity", COLUMNS, rows)
    subscribed = await subscribed_solutions(now)
    changes = [Change(a.id, "created") for a in created if a.solution_id in subscribed]
    events = record_statement(strategy, changes, now) if changes else None
    if shared and len(new) > YIELD_EVERY:
        await pause()  # the light requests that came meanwhile take the database before this batch
    try:
        async with in_transaction() as conn:  # the rows, their events and ``then``, or nothing
            try:
                await strategy.insert_prepared(conn, prepared)
                if events is not None:
                    await conn.execute_query(*events)
            except IntegrityError:
                raise Conflict(
                    "an activity with the same idempotency key or occurrence already exists"
                ) from None
            if then is not None:
                await then(created)
    except DBConnectionError as exc:
        raise Unavailable(f"the database is unreachable: {exc}") from None
    return created


async def _yield() -> None:
    await asyncio.sleep(0)


async def _built(
    new: Sequence[r.NewActivity], now: datetime, between: Callable[[], Awaitable[None]]
) -> tuple[list[r.Activity], list[tuple[Any, ...]]]:
    """The records of ``new`` and their rows' values, with ``between`` awaited every ``YIELD_EVERY``."""
    partitions = {
        kind.id: (kind.partition, kind.limited)
        for kind in {item.activity_type.id: item.activity_type for item in new}.values()
    }
    created: list[r.Activity] = []
    rows: list[tuple[Any, ...]] = []
    for index, item in enumerate(new):
        if index and index % YIELD_EVERY == 0:
            await between()
        created.append(new_activity_record(item, now, partitions[item.activity_type.id]))
        rows.append(_row(created[-1], item.request_hash))
    return created, rows
