"""A batch create is still all-or-nothing now that its rows, ids and statements are built before its
transaction opens (``Store.prepare_activities``, then ``write_prepared_activities`` with the audit row
and the quota in one transaction): a conflict on the last item, or a quota refused after the rows are
written, leaves no activity, no ``created`` event and no audit row, and the quota stays exact."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from oste.domain.clock import SystemClock
from oste.domain.tenancy import QuotaDefaults
from oste.errors import Conflict, TooMany
from oste.operations import SYSTEM, OperationContext, Operations
from oste.storage import Storage
from oste.storage.dialects import Query
from oste.storage.events import forget_subscriptions, subscribe
from oste.storage.store import Store
from tests.factories import T0, make_activity_type, make_company, make_solution, new_activity

pytestmark = pytest.mark.timeout(120)

BATCH = 300


async def _stored(solution_id: uuid.UUID) -> dict[str, int]:
    """The solution's activities and events, and every ``create`` audit row, counted in the database."""
    counts = {}
    for name, sql in (
        ("activities", "SELECT count(*) AS n FROM activity WHERE solution_id = {}"),
        ("events", "SELECT count(*) AS n FROM activity_event WHERE solution_id = {}"),
        ("audit", "SELECT count(*) AS n FROM audit WHERE action = 'create' AND solution_id = {}"),
    ):
        q = Query()
        counts[name] = int((await q.rows(sql.format(q.add(solution_id))))[0]["n"])
    return counts


@pytest.fixture
async def parts(store: Store) -> tuple[Any, ...]:
    storage = Storage(SystemClock())
    ops = Operations(OperationContext(storage, quota_defaults=QuotaDefaults()))
    company = await make_company(storage.store)
    solution = await make_solution(storage.store, company)
    activity_type = await make_activity_type(storage.store, solution)
    await subscribe(solution.id, storage.store.clock.now())  # streamed: each create records an event
    forget_subscriptions()
    return ops, storage.store, company, solution, activity_type


async def test_a_conflict_on_the_last_item_stores_nothing(parts: tuple[Any, ...]) -> None:
    ops, store, company, solution, activity_type = parts
    (first,) = await store.create_activities([new_activity(activity_type, idempotency_key="taken")])
    before = await _stored(solution.id)
    batch = [new_activity(activity_type, T0 + timedelta(minutes=i)) for i in range(BATCH - 1)]
    batch.append(new_activity(activity_type, idempotency_key="taken"))  # the unique key fails last
    with pytest.raises(Conflict):
        await ops.activities.create_many(SYSTEM, company, solution, batch)
    assert await _stored(solution.id) == before
    made = await ops.activities.create_many(SYSTEM, company, solution, batch[:-1])  # the rest, alone
    after = await _stored(solution.id)
    assert after["activities"] == before["activities"] + BATCH - 1
    assert after["events"] == before["events"] + BATCH - 1
    assert after["audit"] == before["audit"] + 1
    assert {a.id for a in made}.isdisjoint({first.id})


async def test_a_quota_refused_after_the_rows_are_written_stores_nothing(parts: tuple[Any, ...]) -> None:
    ops, store, company, solution, activity_type = parts
    company = await store.update_company(company, {"quotas": {"max_scheduled_activities": BATCH - 1}})
    before = await _stored(solution.id)
    batch = [new_activity(activity_type, T0 + timedelta(minutes=i)) for i in range(BATCH)]
    with pytest.raises(TooMany):
        await ops.activities.create_many(SYSTEM, company, solution, batch)
    assert await _stored(solution.id) == before
    await ops.activities.create_many(SYSTEM, company, solution, batch[:-1])  # exactly what fits
    assert (await store.company_usage(company))["scheduled_activities"] == BATCH - 1
    with pytest.raises(TooMany):
        await ops.activities.create_many(SYSTEM, company, solution, batch[-1:])
