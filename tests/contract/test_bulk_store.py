"""BulkChange over the real stores (SQLite and PostgreSQL): small chunks, requeue times, update values."""

from __future__ import annotations

from datetime import timedelta

from oste.domain import records as r
from oste.domain.bulk import UpdatePlan
from oste.storage.bulk import BulkChange
from oste.storage.store import Store
from tests.factories import make_activities, make_type

S = r.ActivityState


async def test_requeue_in_small_chunks_keeps_a_future_time_and_makes_the_rest_due_now(store: Store) -> None:
    activity_type = await make_type(store, "https://x.example/{n}", retries=4)
    solution = await store.get_solution(await store.get_company("acme"), "songs")
    now = store.clock.now()
    past = await make_activities(store, activity_type, now - timedelta(hours=1), count=3)
    future = await make_activities(store, activity_type, now + timedelta(hours=5), count=2)
    for a in [*past, *future]:
        await store.cancel_activity(a)
    result = await BulkChange(store.clock, chunk=2).run(solution, r.ActivityFilter(), "requeue")
    assert (result.matched, result.changed, result.skipped) == (5, 5, {})
    after = {a.id: a for a in (await store.list_activities(solution, r.ActivityFilter(), 10)).items}
    assert all(after[a.id].state is S.SCHEDULED and after[a.id].retries == 4 for a in [*past, *future])
    assert all(after[a.id].next_attempt_at == a.scheduled_for for a in future)
    assert all(now <= after[a.id].next_attempt_at <= store.clock.now() for a in past)
    again = await BulkChange(store.clock, chunk=2).run(solution, r.ActivityFilter(), "requeue")
    assert (again.matched, again.changed) == (5, 0)
    [skip] = again.skipped.values()
    assert skip.count == 5 and skip.reason.startswith("scheduled:")


async def test_an_update_writes_its_values_and_resets_retries_to_the_types(store: Store) -> None:
    activity_type = await make_type(store, "https://x.example/{n}", retries=2)
    solution = await store.get_solution(await store.get_company("acme"), "songs")
    when = store.clock.now() + timedelta(days=1)
    activities = await make_activities(
        store, activity_type, store.clock.now() + timedelta(hours=1), count=3, retries=9
    )
    plan = UpdatePlan({"priority": 7, "retries": None, "scheduled_for": when, "parameter": {"x": "y"}})
    result = await BulkChange(store.clock, chunk=2).run(solution, r.ActivityFilter(), "update", plan)
    assert (result.matched, result.changed) == (3, 3)
    for a in activities:
        now = await store.get_activity(solution, a.id)
        assert (now.priority, now.retries, now.scheduled_for, now.next_attempt_at) == (7, 2, when, when)
        assert now.parameter == {**a.parameter, "x": "y"}
    dry = await BulkChange(store.clock).run(solution, r.ActivityFilter(), "cancel", dry_run=True)
    assert (dry.matched, dry.changed, dry.would_change, len(dry.sample_ids)) == (3, 0, 3, 3)
    assert [(await store.get_activity(solution, a.id)).state for a in activities] == [S.SCHEDULED] * 3
