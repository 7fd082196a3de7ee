"""Issue 38: PostgreSQL's plans of the engine's hot statements, whatever its statistics say. Statistics
read between bursts (or none, in a new database) count few due and few running activities: a claim then
read and sorted every due activity to take a few hundred, a completion read every running one to
complete a few, and a flow claim read every activity of each object it walked past."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from tortoise.transactions import in_transaction

from oste.domain import records as r
from oste.domain.claims import AttemptReport
from oste.domain.delivery import conclude
from oste.domain.partitions import ALL_PARTITIONS
from oste.storage.dialects.postgres import _PG_COMPLETE
from oste.storage.dispatch import DispatchStore
from oste.storage.store import Store
from tests.contract.test_flow_claims import FIFO
from tests.factories import T0, make_activities, make_activity_type, make_type, new_activity

pytestmark = [pytest.mark.timeout(60), pytest.mark.parametrize("database_url", ["postgres"], indirect=True)]
"""PostgreSQL's planner only: SQLite's claim plans are held by tests/contract/test_flow_claims.py, and it
completes through a statement of its own (``sqlite.py``)."""

STATE_INDEXES = ("activity_type_state_idx", "activity_listing_idx", "activity_leased_idx")
"""Indexes that would lead a completion to every running (or leased) activity."""


async def _generic_plan(sql: str, count: int) -> str:
    """The plan a prepared statement settles on (parameters unknown), sequential scans off as a big
    table would have them (the test's table is tiny)."""
    async with in_transaction() as conn:
        await conn.execute_script("SET LOCAL plan_cache_mode = force_generic_plan")
        await conn.execute_script("SET LOCAL enable_seqscan = off")
        await conn.execute_script(f"PREPARE complete AS {sql}")
        try:
            nulls = ", ".join("NULL" for _ in range(count))
            rows = await conn.execute_query_dict(f"EXPLAIN EXECUTE complete({nulls})")
        finally:
            await conn.execute_script("DEALLOCATE complete")
    return "\n".join(row["QUERY PLAN"] for row in rows)


async def test_a_claim_walks_the_due_index_in_order_and_stops_at_its_limit(
    store: Store, dispatch: DispatchStore
) -> None:
    activity_type = await make_type(store, "https://receiver.example/x")
    await make_activities(store, activity_type, T0, count=5000)  # no statistics yet: a new database
    horizon = T0 + timedelta(seconds=1)
    sql, values = dispatch._claim_statement("n1", uuid.uuid4(), T0, T0, ALL_PARTITIONS[::2], 100, horizon, ())
    async with in_transaction() as conn:
        # the test's table is small: make reading it all look cheap, as statistics without the burst do
        await conn.execute_script("SET LOCAL random_page_cost = 100")
        await conn.execute_script(dispatch.strategy.due_in_order_sql)
        rows = await conn.execute_query_dict("EXPLAIN " + sql, values)
    plan = "\n".join(row["QUERY PLAN"] for row in rows)
    assert "Index Scan using activity_scheduled_idx" in plan, plan
    assert "Sort" not in plan and "Bitmap" not in plan, plan  # not every due activity read and sorted
    assert len(await dispatch.claim_due("n1", ALL_PARTITIONS, 100, 30, horizon)) == 100


async def test_a_completion_finds_its_activities_by_id_not_by_state(
    store: Store, dispatch: DispatchStore
) -> None:
    activity_type = await make_type(store, "https://receiver.example/x")
    await make_activities(store, activity_type, T0, count=400)
    async with in_transaction() as conn:  # statistics taken before the burst: nothing running
        await conn.execute_script("ANALYZE activity")
    claims = await dispatch.claim_due("n1", ALL_PARTITIONS, 400, 30, T0)
    assert len(claims) == 400
    plan = await _generic_plan(_PG_COMPLETE, 17)
    assert "activity_pkey" in plan, plan
    assert not [name for name in STATE_INDEXES if name in plan], plan
    report = AttemptReport(r.Outcome.OK, T0, T0, 1.0, 200, None, "fine")
    done = await dispatch.complete([conclude(claim, report, "n1") for claim in claims[:10]])
    assert done.applied == 10  # the statement the plan is of still completes exactly its batch
    stale = await dispatch.complete([conclude(claims[0], report, "n1")])
    assert (stale.applied, stale.stale) == (0, 1)  # a second completion under a spent token changes nothing


async def test_a_flow_claim_counts_each_object_by_its_state_in_the_index(
    store: Store, dispatch: DispatchStore
) -> None:
    """Migration 0029: with two indexes of an object's activities, PostgreSQL took the one without the
    state for the flow claim's counts and read every activity of each object it walked past (a burst
    of 100 objects of 200 activities in order fell from about 1,800 to 430 fires/s)."""
    activity_type = await make_activity_type(store, per_object=FIFO)
    items = [
        new_activity(activity_type, T0 + timedelta(milliseconds=n), parameter={"SongId": n % 20})
        for n in range(400)
    ]
    await store.create_activities(items)
    horizon = T0 + timedelta(seconds=1)
    assert len(await dispatch.claim_due("n1", ALL_PARTITIONS, 100, 30, horizon)) == 20  # each object's head
    sql, values = dispatch._claim_statement(
        "n1", uuid.uuid4(), T0, T0, ALL_PARTITIONS, 100, horizon, (), flows=True
    )
    async with in_transaction() as conn:
        await conn.execute_script(dispatch.strategy.due_in_order_sql)
        rows = await conn.execute_query_dict("EXPLAIN " + sql, values)
    plan = [row["QUERY PLAN"].strip() for row in rows]
    counts = [line for line in plan if "(state)::text = 'running'" in line and "o." not in line]
    assert counts and all(line.startswith("Index Cond:") for line in counts), "\n".join(plan)
    assert len(await dispatch.claim_due("n2", ALL_PARTITIONS, 100, 30, horizon)) == 0  # all held
