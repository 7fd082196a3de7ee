"""A big batch's rows are made ready before its write transaction opens (``Dialect.stage_rows``): on
SQLite they wait in a temporary table of the connection, written in short statements, and the
transaction copies them over in one statement, so a 1,000-item batch holds the one connection every
other request needs for a few milliseconds instead of tens. Whatever the path, the batch is still all
or nothing, in order, with its labels and its created events. Both databases; the staging itself is
SQLite's.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from tortoise import connections

from oste.domain import records as r
from oste.errors import Conflict, Unavailable
from oste.storage import models as m
from oste.storage.activity_inserts import prepare_activities, write_prepared
from oste.storage.dialects import STAGE_ROWS, dialect_of
from oste.storage.events import EventLog
from oste.storage.store import Store
from tests.factories import T0, make_activity_type, new_activity

BATCH = 1000
SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
"""Staging is SQLite's (PostgreSQL's COPY writes the rows in its transaction, and its requests do not
share one connection)."""


@pytest.fixture
async def activity_type(store: Store) -> r.ActivityType:
    return await make_activity_type(store)


def on_sqlite() -> bool:
    return dialect_of(connections.get("default")).name == "sqlite"


async def staging_tables() -> list[str]:
    """The staging tables the connection still holds (SQLite; none elsewhere)."""
    if not on_sqlite():
        return []
    rows = await connections.get("default").execute_query_dict(
        "SELECT name FROM sqlite_temp_master WHERE type = 'table' AND name LIKE 'staged_%'"
    )
    return [row["name"] for row in rows]


async def test_a_staged_batch_is_written_in_order_with_its_labels_and_events(
    store: Store, activity_type: r.ActivityType
) -> None:
    await EventLog(store.clock).subscribe(activity_type.solution_id, T0)  # its created events are recorded
    batch = [new_activity(activity_type, labels={"n": str(n)}) for n in range(BATCH)]
    created = await store.create_activities(batch)
    stored = (
        await m.Activity.filter(solution_id=activity_type.solution_id)
        .order_by("id")
        .values_list("id", flat=True)
    )
    assert list(stored) == sorted(a.id for a in created)
    events = (
        await m.ActivityEvent.filter(solution_id=activity_type.solution_id)
        .order_by("seq")
        .values_list("activity_id", "event", "activity_type_id")
    )
    assert [e[0] for e in events] == [a.id for a in created]
    assert {(e[1], e[2]) for e in events} == {("created", activity_type.id)}
    labels = await m.ActivityLabel.filter(solution_id=activity_type.solution_id).values_list(
        "activity_id", "value"
    )
    assert sorted(labels) == sorted((a.id, a.labels["n"]) for a in created)
    read = await store.list_activities(
        await store._solution_by_id(activity_type.solution_id), r.ActivityFilter(), 3
    )
    assert [a.parameter for a in read.items] == [a.parameter for a in created[:3]]
    assert await staging_tables() == []


async def test_a_staged_batch_that_clashes_writes_nothing_and_leaves_no_table(
    store: Store, activity_type: r.ActivityType
) -> None:
    await store.create_activities([new_activity(activity_type, idempotency_key="taken")])
    batch = [new_activity(activity_type) for _ in range(BATCH - 1)] + [
        new_activity(activity_type, idempotency_key="taken")
    ]
    with pytest.raises(Conflict):
        await store.create_activities(batch)
    assert await m.Activity.filter(solution_id=activity_type.solution_id).count() == 1
    assert await m.ActivityEvent.filter(solution_id=activity_type.solution_id).count() == 0
    assert await staging_tables() == []


@SQLITE_ONLY
async def test_staged_rows_lost_with_their_connection_write_nothing(
    store: Store, activity_type: r.ActivityType
) -> None:
    prepared = await prepare_activities([new_activity(activity_type) for _ in range(BATCH)], T0)
    assert prepared.rows.staged is not None
    # a connection replaced between staging and writing takes its temporary tables with it
    await connections.get("default").execute_script(f"DROP TABLE {prepared.rows.staged}")
    with pytest.raises(Unavailable, match="staged rows were lost with their connection"):
        await write_prepared(prepared)
    assert await m.Activity.filter(solution_id=activity_type.solution_id).count() == 0


@SQLITE_ONLY
async def test_a_big_batchs_write_transaction_holds_no_long_statement(
    store: Store, activity_type: r.ActivityType
) -> None:
    """Every statement of the batch's write transaction is short (the rows were parsed and bound
    before it opened): what another request waits for is SQLite's own copying, not 30,000 values."""
    raw = connections.get("default")._connection  # the aiosqlite connection every request shares
    seen: list[str] = []
    lock = threading.Lock()

    def traced(sql: str) -> None:  # runs in the driver's thread
        with lock:
            seen.append(sql)

    await raw.set_trace_callback(traced)
    try:
        await store.create_activities([new_activity(activity_type) for _ in range(BATCH)])
    finally:
        await raw.set_trace_callback(None)
    staged = [i for i, sql in enumerate(seen) if sql.startswith("INSERT INTO temp.staged_")]
    assert staged, seen[:5]
    write = seen[staged[-1] + 1 :]  # one statement copies them (its own transaction, or the caller's)
    assert any(sql.lstrip().upper().startswith("INSERT INTO") for sql in write), write
    assert max(len(sql) for sql in write) < 2000, [sql[:200] for sql in write if len(sql) >= 2000]
    staging = [sql for sql in seen if sql.startswith("INSERT INTO temp.staged_")]
    assert len(staging) == -(-BATCH // STAGE_ROWS), len(staging)


@SQLITE_ONLY
async def test_other_writes_run_between_a_big_batchs_staging_statements(
    store: Store, activity_type: r.ActivityType
) -> None:
    """While a batch is staged, another request's insert gets the connection between two staging
    statements, rather than after the whole batch."""
    order: list[str] = []

    async def big() -> None:
        await store.create_activities([new_activity(activity_type) for _ in range(BATCH)])
        order.append("batch")

    async def single() -> None:
        while not await staging_tables():  # the batch is being staged  # noqa: ASYNC110
            await asyncio.sleep(0)
        await store.create_activities([new_activity(activity_type)])
        order.append("single")

    await asyncio.wait_for(asyncio.gather(big(), single()), 30)
    assert order == ["single", "batch"]
    assert await m.Activity.filter(solution_id=activity_type.solution_id).count() == BATCH + 1
