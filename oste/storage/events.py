"""The event stream's store: activity state changes, kept for the solutions someone streams.

**Only solutions with a subscriber pay.** A stream that connects marks its solution subscribed for
``EVENT_RETENTION`` (renewed while it stays connected); writers (claims, completions, the rescuer,
every insert of activities, the operations' cancels and requeues) read the subscribed set at most once per
``SUBSCRIBERS_REFRESH`` seconds per process and write event rows only for those solutions. A
deployment nobody streams writes no event row at all; a streamed solution writes one row per state
change (in the same transaction as a completion, right after a claim or an API change).

**Gapless order across writer processes.** Each row gets a ``seq`` (bigserial / SQLite's integer
key) and, on PostgreSQL, the id of the transaction that wrote it (``txid``). The stream reads in
(txid, seq) order and only rows whose transaction is older than the oldest transaction still running
(``pg_snapshot_xmin``): every transaction below that horizon has finished, and every later one gets
a larger id, so no row can ever appear behind a position already streamed. (A seq alone is not
enough: a seq allocated in one process may commit after a larger seq of another.) The price is that
a long-running transaction anywhere in the database cluster holds the stream back until it ends:
events are late then, never lost. SQLite has one writer at a time, so seq order is commit order.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from tortoise import connections
from tortoise.backends.base.client import BaseDBAsyncClient

from oste.domain.claims import Completion
from oste.domain.records import ActivityState
from oste.storage import models as m
from oste.storage.dialects import Dialect, Params, dialect_of
from oste.storage.notices import publish

log = logging.getLogger("oste.storage.events")

EVENT_RETENTION = 7200.0
"""Seconds events are kept (and a solution stays subscribed after its last stream): 2 hours."""
SUBSCRIBERS_REFRESH = 1.0
"""Seconds a process reuses the set of subscribed solutions before reading it again."""
EVENT_NAMES = ("created", "running", "succeeded", "retry_scheduled", "dead", "cancelled", "requeued")
"""The ``event:`` names of the stream."""

_SUBSCRIBED: dict[str, tuple[float, frozenset[uuid.UUID]]] = {}


@dataclass(frozen=True)
class Change:
    """One state change to record: the activity, the event name, its attempt and outcome."""

    activity_id: uuid.UUID
    event: str
    attempt: int = 0
    outcome: str | None = None
    replaced_by: uuid.UUID | None = None
    """A ``cancelled`` event's activity that replaced this one (per-object ``on_new: replace``)."""


@dataclass(frozen=True)
class Event:
    """One stored event, as the stream sends it."""

    txid: int
    seq: int
    activity_id: uuid.UUID
    activity_type_id: uuid.UUID
    object_id: str | None
    event: str
    attempt: int
    outcome: str | None
    at: datetime
    replaced_by: uuid.UUID | None = None

    @property
    def position(self) -> tuple[int, int]:
        return (self.txid, self.seq)


def completion_event(state: ActivityState) -> str:
    """The event a completion writes: succeeded, retry_scheduled or dead."""
    return {ActivityState.SUCCEEDED: "succeeded", ActivityState.SCHEDULED: "retry_scheduled"}.get(
        state, "dead"
    )


async def subscribed_solutions(now: datetime, connection: str = "default") -> frozenset[uuid.UUID]:
    """Solutions whose changes are recorded now (cached for ``SUBSCRIBERS_REFRESH`` seconds)."""
    cached = _SUBSCRIBED.get(connection)
    clock = time.monotonic()
    if cached is not None and clock - cached[0] < SUBSCRIBERS_REFRESH:
        return cached[1]
    rows = await m.EventSubscription.filter(until__gt=now).values_list("solution_id", flat=True)
    found = frozenset(uuid.UUID(str(row)) for row in rows)
    _SUBSCRIBED[connection] = (clock, found)
    return found


def forget_subscriptions() -> None:
    """Drop the cached subscribed set (the next writer reads it again)."""
    _SUBSCRIBED.clear()


async def subscribe(solution_id: uuid.UUID, now: datetime) -> None:
    """Record this solution's changes from now until ``EVENT_RETENTION`` from now."""
    until = now + timedelta(seconds=EVENT_RETENTION)
    if await m.EventSubscription.filter(solution_id=solution_id).update(until=until) == 0:
        await m.EventSubscription.get_or_create(solution_id=solution_id, defaults={"until": until})
    forget_subscriptions()


async def record(conn: BaseDBAsyncClient, strategy: Dialect, changes: Sequence[Change], now: datetime) -> int:
    """Insert one event per change (their activity's solution, type and object id read in the same
    statement); returns how many. Runs in the caller's transaction when there is one."""
    if not changes:
        return 0
    await conn.execute_query(*record_statement(strategy, changes, now))
    return len(changes)


def record_statement(strategy: Dialect, changes: Sequence[Change], now: datetime) -> tuple[str, list[Any]]:
    """``record``'s statement and its values, built without a connection: a writer that knows its
    changes before its transaction opens builds them first, so the transaction holds only the
    statement."""
    p = Params(strategy)
    at = p.add(now)  # placeholders are numbered in the order they appear in the statement
    cast, int_cast, text_cast = strategy.cast("uuid"), strategy.cast("int"), strategy.cast("text")
    values = ", ".join(
        f"({p.uid(c.activity_id)}{cast}, {p.add(c.event)}{text_cast}, {p.add(c.attempt)}{int_cast}, "
        f"{p.add(c.outcome)}{text_cast})"
        for c in changes
    )
    sql = (
        "INSERT INTO activity_event (txid, solution_id, activity_id, activity_type_id, object_id, event, "
        f"attempt, outcome, at) SELECT {strategy.txid_sql}, a.solution_id, a.id, a.activity_type_id, "
        f"a.object_id, v.column2, v.column3, v.column4, {at} FROM (VALUES {values}) AS v "
        "JOIN activity a ON a.id = v.column1"
    )
    if any(c.replaced_by is not None for c in changes):  # rare (on_new: replace): a statement of its own
        return _with_replacements(strategy, changes, now)
    return sql, p.values


def record_staged_statement(
    strategy: Dialect, staged: str, event: str, now: datetime
) -> tuple[str, list[Any]]:
    """``record_statement`` of ``event`` (attempt 0) for every activity staged in ``staged`` (a table
    of ``Dialect.stage_rows``, its rows written to ``activity`` in the same transaction): the
    statement reads the ids there, not from a list of values."""
    p = Params(strategy)
    name = p.add(event)  # placeholders are numbered in the order they appear in the statement
    at = p.add(now)
    sql = (
        "INSERT INTO activity_event (txid, solution_id, activity_id, activity_type_id, object_id, event, "
        f"attempt, outcome, at) SELECT {strategy.txid_sql}, s.solution_id, s.id, s.activity_type_id, "
        f"s.object_id, {name}, 0, NULL, {at} FROM {staged} s ORDER BY s.rowid"
    )
    return sql, p.values


def _with_replacements(strategy: Dialect, changes: Sequence[Change], now: datetime) -> tuple[str, list[Any]]:
    """``record_statement`` for changes of which some name the activity that replaced theirs."""
    p = Params(strategy)
    at = p.add(now)
    cast, int_cast, text_cast = strategy.cast("uuid"), strategy.cast("int"), strategy.cast("text")
    values = ", ".join(
        f"({p.uid(c.activity_id)}{cast}, {p.add(c.event)}{text_cast}, {p.add(c.attempt)}{int_cast}, "
        f"{p.add(c.outcome)}{text_cast}, "
        f"{p.uid(c.replaced_by) if c.replaced_by else p.add(None)}{cast})"
        for c in changes
    )
    sql = (
        "INSERT INTO activity_event (txid, solution_id, activity_id, activity_type_id, object_id, event, "
        f"attempt, outcome, at, replaced_by) SELECT {strategy.txid_sql}, a.solution_id, a.id, "
        f"a.activity_type_id, a.object_id, v.column2, v.column3, v.column4, {at}, v.column5 "
        f"FROM (VALUES {values}) AS v JOIN activity a ON a.id = v.column1"
    )
    return sql, p.values


async def record_created(
    created: Iterable[tuple[uuid.UUID, uuid.UUID]],
    now: datetime,
    conn: BaseDBAsyncClient | None = None,
    connection: str = "default",
) -> int:
    """Record a ``created`` event for each new activity (pairs of solution id and activity id) of a
    subscribed solution. Call it in the transaction that inserted them, after the insert: every path
    that creates activities does (API, import, occurrences, backfills, run-now, follow-ons, handlers),
    so a stream sees ``created`` whatever made the activity. Rows the insert skipped (an occurrence
    that already existed) get no event: the statement joins the activity table.
    """
    subscribed = await subscribed_solutions(now, connection)
    wanted = [
        Change(activity_id, "created") for solution_id, activity_id in created if solution_id in subscribed
    ]
    if not wanted:
        return 0
    conn = conn or connections.get(connection)
    return await record(conn, dialect_of(conn), wanted, now)


async def wants_created(
    solution_ids: Iterable[uuid.UUID], now: datetime, connection: str = "default"
) -> bool:
    """Whether any of these solutions is streamed (so that creating in it records events)."""
    subscribed = await subscribed_solutions(now, connection)
    return not subscribed.isdisjoint(solution_ids)


async def record_changes(
    changes: Iterable[tuple[uuid.UUID, Change]], now: datetime, connection: str = "default"
) -> int:
    """Record the changes of subscribed solutions (pairs of solution id and change) on their own,
    after the changes committed; nothing at all when none of them is subscribed.

    Never raises: the change itself is already written (a claim must reach its node even if its
    ``running`` event cannot be written during an outage); a failure is logged and the event lost.
    """
    try:
        subscribed = await subscribed_solutions(now, connection)
        wanted = [change for solution_id, change in changes if solution_id in subscribed]
        if not wanted:
            return 0
        conn = connections.get(connection)
        return await record(conn, dialect_of(conn), wanted, now)
    except Exception as exc:
        log.warning("could not record activity events: %s", exc)
        return 0


async def announce(solution_id: uuid.UUID, activity_id: uuid.UUID, event: str, at: datetime) -> None:
    """After one activity's state change committed: wake the long-polls waiting on it (in every
    process) and record its event for the solution's stream. Never raises."""
    await publish("default", [activity_id])
    await record_changes([(solution_id, Change(activity_id, event))], at)


def completion_changes(completions: Sequence[Completion], subscribed: frozenset[uuid.UUID]) -> list[Change]:
    """The events of written completions whose solutions are subscribed."""
    return [
        Change(c.activity_id, completion_event(c.state), c.attempt, str(c.report.outcome))
        for c in completions
        if c.solution_id in subscribed
    ]


async def read_after(
    solution_id: uuid.UUID,
    after: tuple[int, int],
    activity_type_id: uuid.UUID | None = None,
    object_id: str | None = None,
    limit: int = 500,
    connection: str = "default",
) -> list[Event]:
    """Up to ``limit`` events of a solution after position ``after`` (txid, seq), in stream order,
    only below the horizon no later row can appear behind."""
    conn = connections.get(connection)
    strategy = dialect_of(conn)
    p = Params(strategy)
    txid, seq = after
    where = (
        f"solution_id = {p.uid(solution_id)} AND (txid > {p.add(txid)} OR (txid = {p.add(txid)} "
        f"AND seq > {p.add(seq)}))"
    )
    if strategy.streamable_sql:
        where += f" AND {strategy.streamable_sql}"
    if activity_type_id is not None:
        where += f" AND activity_type_id = {p.uid(activity_type_id)}"
    if object_id is not None:
        where += f" AND object_id = {p.add(object_id)}"
    sql = (
        "SELECT txid, seq, activity_id, activity_type_id, object_id, event, attempt, outcome, at, "
        "replaced_by "
        f"FROM activity_event WHERE {where} ORDER BY txid, seq LIMIT {p.add(limit)}"
    )
    rows = await conn.execute_query_dict(sql, p.values)
    return [_event(strategy, row) for row in rows]


async def end_position(solution_id: uuid.UUID, connection: str = "default") -> tuple[int, int]:
    """The position of the solution's last streamable event ((0, 0) when none)."""
    conn = connections.get(connection)
    strategy = dialect_of(conn)
    p = Params(strategy)
    where = f"solution_id = {p.uid(solution_id)}"
    if strategy.streamable_sql:
        where += f" AND {strategy.streamable_sql}"
    sql = f"SELECT txid, seq FROM activity_event WHERE {where} ORDER BY txid DESC, seq DESC LIMIT 1"
    rows = await conn.execute_query_dict(sql, p.values)
    return (int(rows[0]["txid"]), int(rows[0]["seq"])) if rows else (0, 0)


async def prune(before: datetime) -> int:
    """Delete events older than ``before`` and subscriptions that ended before it."""
    deleted = await m.ActivityEvent.filter(at__lt=before).delete()
    await m.EventSubscription.filter(until__lt=before).delete()
    return deleted


def _event(strategy: Dialect, row: dict[str, Any]) -> Event:
    return Event(
        txid=int(row["txid"]),
        seq=int(row["seq"]),
        activity_id=strategy.uuid_of(row["activity_id"]),
        activity_type_id=strategy.uuid_of(row["activity_type_id"]),
        object_id=row["object_id"],
        event=row["event"],
        attempt=int(row["attempt"]),
        outcome=row["outcome"],
        at=strategy.time_of(row["at"]),
        replaced_by=strategy.optional_uuid_of(row.get("replaced_by")),
    )


class EventLog:
    """Storage's event log part (``storage.events``): what the stream endpoints read and what the
    engine prunes. Writers record events through the operations' unit of work (``Storage.atomic`` and
    ``Storage.record_events``) and the insert path, never through this face."""

    retention = EVENT_RETENTION

    def __init__(self, clock: Any) -> None:
        self.clock = clock

    async def subscribe(self, solution_id: uuid.UUID, now: datetime) -> None:
        """Record this solution's changes from ``now`` until ``EVENT_RETENTION`` after it."""
        await subscribe(solution_id, now)

    async def end_position(self, solution_id: uuid.UUID) -> tuple[int, int]:
        """The position of the solution's last streamable event ((0, 0) when none)."""
        return await end_position(solution_id)

    async def read_after(
        self,
        solution_id: uuid.UUID,
        after: tuple[int, int],
        activity_type_id: uuid.UUID | None = None,
        object_id: str | None = None,
        limit: int = 500,
    ) -> list[Event]:
        """Up to ``limit`` events of a solution after ``after``, in stream order (see ``read_after``)."""
        return await read_after(solution_id, after, activity_type_id, object_id, limit)

    async def prune(self, before: datetime | None = None) -> int:
        """Delete events older than ``before`` (default: the retention before now) and the
        subscriptions that ended before it; returns how many events."""
        if before is None:
            before = self.clock.now() - timedelta(seconds=self.retention)
        return await prune(before)
