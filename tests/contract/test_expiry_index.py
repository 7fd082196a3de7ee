"""Migration 0028 (issue 38): the expiry index holds only the scheduled activities that have an expiry,
and the expiry sweep still reads it, on both databases; on PostgreSQL the activity table keeps part of
each page free for the updates of the rows it holds."""

from __future__ import annotations

import importlib
import uuid
from datetime import timedelta

import asyncpg
import pytest
from tortoise import connections
from tortoise.transactions import in_transaction

from oste.domain import records as r
from oste.domain.clock import ManualClock
from oste.storage.dispatch import DispatchStore
from oste.storage.store import Store
from tests.conftest import migrated
from tests.factories import T0, make_activity_type, new_activity

pytestmark = pytest.mark.timeout(60)

FILLFACTOR = importlib.import_module("oste.storage.migrations.0028_activity_fillfactor").FILLFACTOR


async def _stored(store: Store, without: int, expiring: int) -> list[r.Activity]:
    activity_type = await make_activity_type(store)
    items = [new_activity(activity_type, T0 + timedelta(hours=1)) for _ in range(without)]
    items += [
        new_activity(activity_type, T0 + timedelta(hours=1), expires_at=T0 + timedelta(minutes=n + 1))
        for n in range(expiring)
    ]
    return await store.create_activities(items)


def _sweep(dispatch: DispatchStore, late_types: list[tuple[uuid.UUID, float]]) -> tuple[str, list]:
    """The sweep's pick (the sub-select of its claim) and its values."""
    return dispatch._expiry_statement("n1", uuid.uuid4(), T0, T0 + timedelta(hours=2), late_types, 100)


async def _postgres_plan(sql: str, values: list) -> str:
    """The generic plan (the one a prepared statement settles on, bound parameters unknown)."""
    async with in_transaction() as conn:
        await conn.execute_script("ANALYZE activity")
        await conn.execute_script("SET LOCAL plan_cache_mode = force_generic_plan")
        await conn.execute_script("SET LOCAL enable_seqscan = off")  # a tiny table: show the index choice
        await conn.execute_script(f"PREPARE sweep AS {sql}")
        try:
            nulls = ", ".join("NULL" for _ in values)
            rows = await conn.execute_query_dict(f"EXPLAIN EXECUTE sweep({nulls})")
        finally:
            await conn.execute_script("DEALLOCATE sweep")
    return "\n".join(row["QUERY PLAN"] for row in rows)


async def test_the_expiry_index_holds_only_expiring_rows_and_the_sweep_reads_it(
    store: Store, dispatch: DispatchStore, clock: ManualClock, database_url: str
) -> None:
    made = await _stored(store, without=300, expiring=3)
    db = connections.get("default")
    sql, values = _sweep(dispatch, [])
    if database_url.startswith("sqlite"):
        picked = sql[sql.index("(SELECT id FROM activity") + 1 : sql.rindex(") RETURNING")]
        plan = str(await db.execute_query_dict("EXPLAIN QUERY PLAN " + picked, values[4:]))
    else:
        await db.execute_script("VACUUM ANALYZE activity")  # the index's entries counted exactly
        plan = await _postgres_plan(sql, values)
        stats = await db.execute_query_dict(
            "SELECT reltuples FROM pg_class WHERE relname = 'activity_expiring_idx'"
        )
        assert stats[0]["reltuples"] == 3  # the 300 without an expiry are not in it
    assert "activity_expiring_idx" in plan, plan  # usable with the parameters unknown
    clock.set(T0 + timedelta(minutes=2, seconds=30))
    claims = await dispatch.claim_expired("n1", 100, 30)
    assert {c.activity_id for c in claims} == {a.id for a in made[300:302]}


async def test_postgres_keeps_a_part_of_each_activity_page_free(postgres_url: str) -> None:
    await migrated(postgres_url)
    db = await asyncpg.connect(postgres_url)
    try:
        options = await db.fetchval("SELECT reloptions FROM pg_class WHERE relname = 'activity'")
    finally:
        await db.close()
    assert f"fillfactor={FILLFACTOR}" in options
