"""The Store contract, part 2: activities (batches, idempotency, filters, changes, cancel, bulk) and
recurring activities. Every test runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest

from oste.domain import records as r
from oste.domain.clock import ManualClock
from oste.domain.ids import new_id
from oste.errors import Conflict, InvalidInput, NotFound
from oste.storage import models as m
from oste.storage.store import Store
from tests.contract.store_support import every_page, ids, set_running, set_state
from tests.factories import (
    T0,
    make_activities,
    make_activity_type,
    make_recurring,
    make_solution,
    new_activity,
)

HOUR = timedelta(hours=1)
S = r.ActivityState


@pytest.fixture
async def activity_type(store: Store) -> r.ActivityType:
    """An activity type in a fresh company and solution."""
    return await make_activity_type(store)


@pytest.fixture
async def solution(store: Store, activity_type: r.ActivityType) -> r.Solution:
    return await store._solution_by_id(activity_type.solution_id)


async def count(solution: r.Solution) -> int:
    return await m.Activity.filter(solution_id=solution.id).count()


# --- creating -------------------------------------------------------------------------------------


async def test_created_activities_read_back_as_returned(
    store: Store, activity_type: r.ActivityType, solution: r.Solution
) -> None:
    batch = [
        new_activity(activity_type, T0 + n * HOUR, priority=n, parameter={"SongId": n, "Title": "é/ü"})
        for n in range(5)
    ]
    created = await store.create_activities(batch)
    assert [a.parameter for a in created] == [item.parameter for item in batch]
    assert ids(created) == sorted(ids(created)), "ids sort in creation order"
    for activity, item in zip(created, batch, strict=True):
        assert activity.state is S.SCHEDULED
        assert (activity.activity_type_id, activity.activity_type) == (activity_type.id, activity_type.name)
        assert (activity.company_id, activity.solution_id, activity.partition) == (
            activity_type.company_id,
            activity_type.solution_id,
            r.spread_partition(activity.id),  # a type without limits: spread by activity id
        )
        assert activity.scheduled_for == activity.next_attempt_at == item.scheduled_for
        assert (activity.priority, activity.retries, activity.object_id) == (item.priority, 3, item.object_id)
        assert (activity.attempts, activity.last_outcome, activity.finished_at) == (0, None, None)
        assert activity.created_at == activity.updated_at == T0
        assert await store.get_activity(solution, activity.id) == activity


async def test_an_empty_batch_creates_nothing(store: Store, solution: r.Solution) -> None:
    assert await store.create_activities([]) == []
    assert await count(solution) == 0


async def test_activities_without_idempotency_keys_never_clash(
    store: Store, activity_type: r.ActivityType
) -> None:
    same = {"SongId": 1}
    created = await make_activities(store, activity_type, count=3, parameter=same)
    created += await make_activities(store, activity_type, count=3, parameter=same)
    assert len(set(ids(created))) == 6


async def test_a_batch_with_a_repeated_idempotency_key_writes_nothing(
    store: Store, activity_type: r.ActivityType, solution: r.Solution
) -> None:
    batch = [new_activity(activity_type, idempotency_key=f"k-{n}") for n in range(3)]
    batch.append(new_activity(activity_type, idempotency_key="k-1"))
    with pytest.raises(Conflict, match="idempotency key or occurrence"):
        await store.create_activities(batch)
    assert await count(solution) == 0


async def test_a_batch_repeating_a_stored_idempotency_key_writes_nothing(
    store: Store, activity_type: r.ActivityType, solution: r.Solution
) -> None:
    (stored,) = await store.create_activities([new_activity(activity_type, idempotency_key="k-1")])
    with pytest.raises(Conflict):
        await store.create_activities(
            [new_activity(activity_type), new_activity(activity_type, idempotency_key="k-1")]
        )
    assert [a.id for a in (await store.list_activities(solution, r.ActivityFilter(), 10)).items] == [
        stored.id
    ]


async def test_a_batch_repeating_a_recurring_occurrence_writes_nothing(
    store: Store, activity_type: r.ActivityType, solution: r.Solution
) -> None:
    recurring = await make_recurring(store, activity_type)
    occurrence = dict(recurring_activity_id=recurring.id, occurrence_at=T0 + HOUR)
    batch = [
        new_activity(
            activity_type, T0 + 2 * HOUR, recurring_activity_id=recurring.id, occurrence_at=T0 + 2 * HOUR
        ),
        new_activity(activity_type, T0 + HOUR, **occurrence),
        new_activity(activity_type, T0 + HOUR, **occurrence),
    ]
    with pytest.raises(Conflict):
        await store.create_activities(batch)
    assert await count(solution) == 0
    await store.create_activities(batch[:2])
    with pytest.raises(Conflict):
        await store.create_activities([new_activity(activity_type, T0 + HOUR, **occurrence)])
    assert await count(solution) == 2


async def test_a_large_batch_is_all_or_nothing_across_insert_chunks(
    store: Store, activity_type: r.ActivityType, solution: r.Solution
) -> None:
    batch = [new_activity(activity_type, idempotency_key=f"k-{n}") for n in range(1100)]
    clashing = [*batch, new_activity(activity_type, idempotency_key="k-3")]  # the clash is in the last chunk
    with pytest.raises(Conflict):
        await store.create_activities(clashing)
    assert await count(solution) == 0
    created = await store.create_activities(batch)
    seen, pages = await every_page(
        lambda n, c: store.list_activities(solution, r.ActivityFilter(), n, c), 1000
    )
    assert ids(seen) == ids(created)
    assert pages == 2


async def test_idempotency_keys_are_scoped_to_a_solution(store: Store, activity_type: r.ActivityType) -> None:
    other = await make_activity_type(store)
    first, created = await store.create_activity_once(
        new_activity(activity_type, idempotency_key="k", request_hash="h")
    )
    second, created_again = await store.create_activity_once(
        new_activity(other, idempotency_key="k", request_hash="h")
    )
    assert created and created_again
    assert first.id != second.id


# --- idempotent creation --------------------------------------------------------------------------


async def test_the_same_key_and_body_returns_the_stored_activity(
    store: Store, activity_type: r.ActivityType, solution: r.Solution, clock: ManualClock
) -> None:
    first, created = await store.create_activity_once(
        new_activity(activity_type, idempotency_key="k", request_hash="h")
    )
    assert created
    clock.advance(10)
    again, created = await store.create_activity_once(
        new_activity(activity_type, T0 + HOUR, idempotency_key="k", request_hash="h")
    )
    assert not created
    assert again == first
    assert again.idempotency_key == "k"
    assert await count(solution) == 1


async def test_the_same_key_with_another_body_is_invalid_input_naming_the_header(
    store: Store, activity_type: r.ActivityType, solution: r.Solution
) -> None:
    await store.create_activity_once(new_activity(activity_type, idempotency_key="k", request_hash="h1"))
    with pytest.raises(InvalidInput) as exc:
        await store.create_activity_once(new_activity(activity_type, idempotency_key="k", request_hash="h2"))
    assert [e.field for e in exc.value.errors] == ["Idempotency-Key"]
    assert "different request body" in exc.value.detail
    assert await count(solution) == 1


async def test_without_a_key_every_creation_is_new(store: Store, activity_type: r.ActivityType) -> None:
    first, created_first = await store.create_activity_once(
        new_activity(activity_type, parameter={"SongId": 1})
    )
    second, created_second = await store.create_activity_once(
        new_activity(activity_type, parameter={"SongId": 1})
    )
    assert created_first and created_second and first.id != second.id


async def test_concurrent_creations_with_one_key_create_one_activity(
    store: Store, activity_type: r.ActivityType, solution: r.Solution
) -> None:
    attempts = [new_activity(activity_type, idempotency_key="race", request_hash="h") for _ in range(12)]
    results = await asyncio.gather(*(store.create_activity_once(a) for a in attempts))
    assert [created for _, created in results].count(True) == 1
    assert len({activity.id for activity, _ in results}) == 1
    assert await count(solution) == 1


# --- reading and listing --------------------------------------------------------------------------


async def test_an_activity_of_another_solution_is_not_found(
    store: Store, activity_type: r.ActivityType
) -> None:
    (activity,) = await make_activities(store, activity_type)
    elsewhere = await make_solution(store, await store.get_company_by_id(activity_type.company_id))
    with pytest.raises(NotFound):
        await store.get_activity(elsewhere, activity.id)
    with pytest.raises(NotFound):
        await store.get_activity(await store._solution_by_id(activity_type.solution_id), uuid.uuid4())


async def test_list_filters(store: Store, activity_type: r.ActivityType, solution: r.Solution) -> None:
    other_type = await make_activity_type(store, solution)
    recurring = await make_recurring(store, activity_type)
    a1, a2 = await store.create_activities(
        [
            new_activity(activity_type, T0 + HOUR, parameter={"SongId": 1}),
            new_activity(activity_type, T0 + 2 * HOUR, parameter={"SongId": 2}),
        ]
    )
    (a3,) = await make_activities(store, other_type, T0 + 3 * HOUR, parameter={"SongId": 1})
    (a4,) = await make_activities(store, activity_type, T0 + 4 * HOUR, parameter={"SongId": 1})
    await store.cancel_activity(a4)
    (r1,) = await store.create_activities(
        [
            new_activity(
                activity_type,
                T0 + 5 * HOUR,
                parameter={"SongId": 9},
                recurring_activity_id=recurring.id,
                occurrence_at=T0 + 5 * HOUR,
            )
        ]
    )
    await make_activities(store, await make_activity_type(store), parameter={"SongId": 1})  # another tenant

    async def listed(**filters: object) -> list[uuid.UUID]:
        page = await store.list_activities(solution, r.ActivityFilter(**filters), 100)
        assert page.next_cursor is None
        return ids(page.items)

    paris = ZoneInfo("Europe/Paris")
    assert await listed() == ids([a1, a2, a3, a4, r1])
    assert await listed(state=S.CANCELLED) == ids([a4])
    assert await listed(state=S.SCHEDULED) == ids([a1, a2, a3, r1])
    assert await listed(state=S.RUNNING) == []
    assert await listed(activity_type_id=other_type.id) == ids([a3])
    assert await listed(object_id="1") == ids([a1, a3, a4])
    assert await listed(scheduled_after=T0 + 2 * HOUR) == ids([a2, a3, a4, r1])
    assert await listed(scheduled_before=T0 + 2 * HOUR) == ids([a1])
    assert await listed(scheduled_after=T0 + 2 * HOUR, scheduled_before=T0 + 4 * HOUR) == ids([a2, a3])
    assert await listed(scheduled_after=(T0 + 2 * HOUR).astimezone(paris)) == ids([a2, a3, a4, r1])
    assert await listed(recurring_activity_id=recurring.id) == ids([r1])
    assert await listed(activity_type_id=activity_type.id, object_id="1", state=S.SCHEDULED) == ids([a1])
    seen, pages = await every_page(
        lambda n, c: store.list_activities(solution, r.ActivityFilter(object_id="1"), n, c), 1
    )
    assert (ids(seen), pages) == (ids([a1, a3, a4]), 3)


async def test_instants_given_in_any_offset_are_stored_and_compared_as_utc(
    store: Store, activity_type: r.ActivityType, solution: r.Solution
) -> None:
    new_york = ZoneInfo("America/New_York")  # 09:00-05:00 would sort before 13:45+00:00 as text
    recurring = await make_recurring(store, activity_type)
    at = (T0 + 2 * HOUR).astimezone(new_york)
    late, early = await store.create_activities(
        [
            new_activity(activity_type, at, recurring_activity_id=recurring.id, occurrence_at=at),
            new_activity(activity_type, T0 + 90 * timedelta(minutes=1)),
        ]
    )
    after = r.ActivityFilter(scheduled_after=T0 + 105 * timedelta(minutes=1))
    assert ids((await store.list_activities(solution, after, 10)).items) == [late.id]
    assert (await store.get_activity(solution, late.id)).next_attempt_at == T0 + 2 * HOUR
    with pytest.raises(Conflict):  # the same occurrence, spelled in UTC
        await store.create_activities(
            [
                new_activity(
                    activity_type,
                    T0 + 2 * HOUR,
                    recurring_activity_id=recurring.id,
                    occurrence_at=T0 + 2 * HOUR,
                )
            ]
        )
    await store.update_scheduled_activity(early, {"scheduled_for": (T0 + 3 * HOUR).astimezone(new_york)})
    assert ids((await store.list_activities(solution, after, 10)).items) == [late.id, early.id]
    before = r.ActivityFilter(scheduled_before=(T0 + 150 * timedelta(minutes=1)).astimezone(new_york))
    assert ids((await store.list_activities(solution, before, 10)).items) == [late.id]


# --- changing and cancelling ----------------------------------------------------------------------


async def test_a_scheduled_activity_can_be_changed(
    store: Store, activity_type: r.ActivityType, solution: r.Solution, clock: ManualClock
) -> None:
    (activity,) = await make_activities(store, activity_type)
    clock.advance(1)
    changes = {"priority": 7, "parameter": {"SongId": 99}, "object_id": "99", "scheduled_for": T0 + 3 * HOUR}
    updated = await store.update_scheduled_activity(activity, changes)
    assert (updated.priority, updated.parameter, updated.object_id) == (7, {"SongId": 99}, "99")
    assert updated.scheduled_for == updated.next_attempt_at == T0 + 3 * HOUR
    assert (updated.updated_at, updated.created_at) == (clock.now(), T0)
    assert await store.get_activity(solution, activity.id) == updated


@pytest.mark.parametrize("state", [S.RUNNING, S.SUCCEEDED, S.DEAD, S.CANCELLED])
async def test_only_a_scheduled_activity_can_be_changed(
    store: Store, activity_type: r.ActivityType, solution: r.Solution, state: S
) -> None:
    (activity,) = await make_activities(store, activity_type)
    await set_state(activity, state)
    before = await store.get_activity(solution, activity.id)
    with pytest.raises(Conflict) as exc:
        await store.update_scheduled_activity(activity, {"priority": 5})
    assert f"activity is {state}" in exc.value.detail
    assert await store.get_activity(solution, activity.id) == before


async def test_cancel_a_scheduled_activity(
    store: Store, activity_type: r.ActivityType, solution: r.Solution, clock: ManualClock
) -> None:
    (activity,) = await make_activities(store, activity_type)
    clock.advance(3)
    cancelled = await store.cancel_activity(activity)
    assert (cancelled.state, cancelled.finished_at, cancelled.updated_at) == (
        S.CANCELLED,
        clock.now(),
        clock.now(),
    )
    assert await store.get_activity(solution, activity.id) == cancelled


async def test_cancelling_a_running_activity_drops_its_claim(
    store: Store, activity_type: r.ActivityType
) -> None:
    (activity,) = await make_activities(store, activity_type)
    await set_running(activity, T0 + HOUR)
    assert (await store.cancel_activity(activity)).state is S.CANCELLED
    row = await m.Activity.get(id=activity.id)
    assert (row.claim_token, row.claimed_by, row.lease_expires_at) == (None, None, None)


@pytest.mark.parametrize("state", [S.SUCCEEDED, S.DEAD, S.CANCELLED])
async def test_a_finished_activity_cannot_be_cancelled(
    store: Store, activity_type: r.ActivityType, solution: r.Solution, state: S
) -> None:
    (activity,) = await make_activities(store, activity_type)
    await set_state(activity, state, finished_at=T0)
    with pytest.raises(Conflict, match=f"already {state}"):
        await store.cancel_activity(activity)
    after = await store.get_activity(solution, activity.id)
    assert (after.state, after.finished_at) == (state, T0)


async def test_executions_are_listed_per_activity_across_pages(
    store: Store, activity_type: r.ActivityType
) -> None:
    first, second = await make_activities(store, activity_type, count=2)
    assert await store.list_executions(first, 10) == r.Page([], None)
    for attempt in (1, 2, 3):
        for activity in (first, second):
            await m.Execution.create(
                id=new_id(),
                activity_id=activity.id,
                attempt=attempt,
                started_at=T0 + attempt * HOUR,
                finished_at=T0 + attempt * HOUR,
                duration_ms=12.5,
                outcome="error" if attempt < 3 else "ok",
                http_status=503 if attempt < 3 else 200,
                error="Service Unavailable" if attempt < 3 else None,
                node="node-1",
            )
    seen, pages = await every_page(lambda n, c: store.list_executions(first, n, c), 2)
    assert [(e.activity_id, e.attempt) for e in seen] == [(first.id, 1), (first.id, 2), (first.id, 3)]
    assert [e.outcome for e in seen] == [r.Outcome.ERROR, r.Outcome.ERROR, r.Outcome.OK]
    assert all(isinstance(e.outcome, r.Outcome) for e in seen)
    assert pages == 2


# --- bulk operations ------------------------------------------------------------------------------


async def test_requeue_puts_dead_and_cancelled_activities_back(
    store: Store, activity_type: r.ActivityType, solution: r.Solution, clock: ManualClock
) -> None:
    dead, ahead, done = await store.create_activities(
        [
            new_activity(activity_type, T0),
            new_activity(activity_type, T0 + 5 * HOUR),
            new_activity(activity_type, T0),
        ]
    )
    await set_state(dead, S.DEAD, retries=-1, finished_at=T0, attempts=4)
    await store.cancel_activity(ahead)
    await set_state(done, S.SUCCEEDED, finished_at=T0)
    clock.advance(3600)
    assert [await store.requeue_activity(solution, a.id) for a in (dead, ahead, done)] == [True, True, False]
    dead_now, ahead_now, done_now = [await store.get_activity(solution, a.id) for a in (dead, ahead, done)]
    assert (dead_now.state, dead_now.retries, dead_now.finished_at) == (
        S.SCHEDULED,
        activity_type.retries,
        None,
    )
    assert dead_now.next_attempt_at == clock.now(), "a requeued activity that was due is due now"
    assert (ahead_now.state, ahead_now.next_attempt_at) == (S.SCHEDULED, T0 + 5 * HOUR)
    assert done_now.state is S.SUCCEEDED


async def test_requeue_one_activity_by_id(
    store: Store, activity_type: r.ActivityType, solution: r.Solution
) -> None:
    first, second = await make_activities(store, activity_type, count=2)
    await set_state(first, S.DEAD)
    await set_state(second, S.DEAD)
    assert await store.requeue_activity(solution, first.id)
    assert (await store.get_activity(solution, first.id)).state is S.SCHEDULED
    assert (await store.get_activity(solution, second.id)).state is S.DEAD
    assert not await store.requeue_activity(solution, first.id), "a scheduled one is not requeued again"


# --- recurring activities -------------------------------------------------------------------------


async def test_a_recurring_activity_reads_back_as_created(
    store: Store, activity_type: r.ActivityType, solution: r.Solution
) -> None:
    recurring = await make_recurring(
        store,
        activity_type,
        schedule={"day_of_week": "mon-fri", "hour": "9"},
        timezone="America/New_York",
        start_at=T0,
        end_at=T0 + timedelta(days=30),
        retries=1,
        priority=3,
        paused=True,
    )
    assert (recurring.activity_type_id, recurring.activity_type) == (activity_type.id, activity_type.name)
    assert (recurring.schedule, recurring.timezone) == (
        {"day_of_week": "mon-fri", "hour": "9"},
        "America/New_York",
    )
    assert (recurring.start_at, recurring.end_at) == (T0, T0 + timedelta(days=30))
    assert (recurring.retries, recurring.priority, recurring.paused) == (1, 3, True)
    assert recurring.created_at == recurring.updated_at == T0
    assert await store.get_recurring(solution, recurring.id) == recurring


async def test_a_recurring_activity_of_another_solution_is_not_found(
    store: Store, activity_type: r.ActivityType
) -> None:
    recurring = await make_recurring(store, activity_type)
    with pytest.raises(NotFound):
        await store.get_recurring(await make_solution(store), recurring.id)
    with pytest.raises(NotFound):
        await store.get_recurring(await store._solution_by_id(activity_type.solution_id), uuid.uuid4())


async def test_recurring_activities_are_listed_per_solution_and_type(
    store: Store, activity_type: r.ActivityType, solution: r.Solution
) -> None:
    other_type = await make_activity_type(store, solution)
    mine = [await make_recurring(store, activity_type if n % 2 else other_type) for n in range(5)]
    await make_recurring(store, await make_activity_type(store))
    seen, pages = await every_page(lambda n, c: store.list_recurring(solution, n, c), 2)
    assert (seen, pages) == (mine, 3)
    of_activity_type = await store.list_recurring(solution, 10, activity_type=activity_type)
    assert of_activity_type.items == [rec for rec in mine if rec.activity_type_id == activity_type.id]


async def test_update_a_recurring_activity(
    store: Store, activity_type: r.ActivityType, solution: r.Solution, clock: ManualClock
) -> None:
    recurring = await make_recurring(store, activity_type)
    clock.advance(1)
    changes = {"paused": True, "schedule": {"cron": "@hourly"}, "parameter": {"SongId": 8}, "object_id": "8"}
    updated = await store.update_recurring(recurring, changes)
    assert (updated.paused, updated.schedule, updated.parameter, updated.object_id) == (
        True,
        {"cron": "@hourly"},
        {"SongId": 8},
        "8",
    )
    assert updated.updated_at == clock.now()
    assert await store.get_recurring(solution, recurring.id) == updated


async def test_moving_a_recurring_activity_to_another_type_moves_its_partition(
    store: Store, activity_type: r.ActivityType, solution: r.Solution
) -> None:
    recurring = await make_recurring(store, activity_type)
    other_type = await make_activity_type(store, solution)
    moved = await store.update_recurring(recurring, {}, other_type)
    assert (moved.activity_type_id, moved.activity_type) == (other_type.id, other_type.name)
    assert (await m.RecurringActivity.get(id=recurring.id)).partition == other_type.partition


async def test_updating_a_deleted_recurring_activity_is_not_found(
    store: Store, activity_type: r.ActivityType
) -> None:
    recurring = await make_recurring(store, activity_type)
    await store.delete_recurring(recurring)
    with pytest.raises(NotFound):
        await store.update_recurring(recurring, {"paused": True})


async def test_deleting_a_recurring_activity_cancels_its_scheduled_occurrences_only(
    store: Store, activity_type: r.ActivityType, solution: r.Solution, clock: ManualClock
) -> None:
    doomed, kept = await make_recurring(store, activity_type), await make_recurring(store, activity_type)

    def occurrence(recurring: r.RecurringActivity, hours: int) -> r.NewActivity:
        at = T0 + hours * HOUR
        return new_activity(activity_type, at, recurring_activity_id=recurring.id, occurrence_at=at)

    past, running, future, later = await store.create_activities(
        [occurrence(doomed, 1), occurrence(doomed, 2), occurrence(doomed, 3), occurrence(doomed, 4)]
    )
    (kept_future,) = await store.create_activities([occurrence(kept, 3)])
    await set_state(past, S.SUCCEEDED, finished_at=T0)
    await set_running(running, T0 + 3 * HOUR)
    clock.advance(60)
    await store.delete_recurring(doomed)
    with pytest.raises(NotFound):
        await store.get_recurring(solution, doomed.id)
    states = {a.id: a for a in (await store.list_activities(solution, r.ActivityFilter(), 10)).items}
    assert [states[a.id].state for a in (past, running, future, later)] == [
        S.SUCCEEDED,
        S.RUNNING,
        S.CANCELLED,
        S.CANCELLED,
    ]
    assert states[future.id].finished_at == clock.now()
    assert states[kept_future.id].state is S.SCHEDULED
    assert await store.get_recurring(solution, kept.id) == kept
