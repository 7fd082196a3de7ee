"""The RecurrenceStore contract on SQLite and PostgreSQL: idempotent materialisation, stale plans
dropped, pause/resume/replace semantics. Time is a ManualClock."""

from __future__ import annotations

import uuid
from datetime import timedelta

from oste.domain import records as r
from oste.domain.clock import ManualClock
from oste.storage.occurrences import RecurrenceStore, recurrence_of
from oste.storage.store import Store
from tests.factories import T0, make_activity_type, make_recurring, recurring_values


async def _setup(store: Store) -> tuple[Store, RecurrenceStore, ManualClock, r.RecurringActivity]:
    clock = ManualClock(T0 + timedelta(seconds=30))
    timed = Store(clock)
    activity_type = await make_activity_type(timed)
    recurring = await make_recurring(
        timed, activity_type, schedule={"cron": "* * * * *"}, timezone="UTC", planned_until=T0, expand_at=T0
    )
    return timed, RecurrenceStore(clock), clock, recurring


async def _solution(store: Store, recurring: r.RecurringActivity) -> r.Solution:
    company = await store.get_company_by_id(recurring.company_id)
    solutions = await store.list_solutions(company, 10)
    return next(s for s in solutions.items if s.id == recurring.solution_id)


async def _listed(store: Store, recurring: r.RecurringActivity) -> list[r.Activity]:
    solution = await _solution(store, recurring)
    page = await store.list_activities(solution, r.ActivityFilter(recurring_activity_id=recurring.id), 1000)
    return sorted(page.items, key=lambda a: a.occurrence_at)


async def test_expanding_twice_creates_nothing_more(store: Store) -> None:
    timed, occurrences, _, recurring = await _setup(store)
    first = await occurrences.expand([recurring], lookahead=150)
    assert (first.created, first.stale) == (3, 0)  # 12:01, 12:02, 12:03
    again = await occurrences.expand([recurring], lookahead=150)  # the same (stale) read: dropped whole
    assert (again.created, again.stale) == (0, 1)
    fresh = await occurrences.get(recurring.id)
    assert (await occurrences.expand([fresh], lookahead=150)).created == 0
    listed = await _listed(timed, recurring)
    assert [a.occurrence_at for a in listed] == [T0 + timedelta(minutes=n) for n in (1, 2, 3)]
    assert len({a.idempotency_key for a in listed}) == 3
    assert (await occurrences.get(recurring.id)).runs == 3


async def test_pause_cancels_resume_replans_patch_replaces(store: Store) -> None:
    timed, occurrences, clock, recurring = await _setup(store)
    await occurrences.expand([recurring], lookahead=60)
    await occurrences.pause(await occurrences.get(recurring.id))
    assert [a.state for a in await _listed(timed, recurring)] == [r.ActivityState.CANCELLED]
    assert (await occurrences.materialise(recurring.id)).created == 0  # paused: left alone
    clock.advance(300)  # paused through 12:01-12:05; now 12:05:30
    await occurrences.resume(await occurrences.get(recurring.id))
    result = await occurrences.materialise(recurring.id)
    listed = await _listed(timed, recurring)
    # the pause's cancelled occurrence is forgotten; latest missed (12:05) fires now, 12:06 ahead
    assert [(a.occurrence_at, a.state) for a in listed] == [
        (T0 + timedelta(minutes=5), r.ActivityState.SCHEDULED),
        (T0 + timedelta(minutes=6), r.ActivityState.SCHEDULED),
    ]
    # it keeps its instant on the schedule (due at once; its lateness shows in the fire lag)
    assert listed[0].scheduled_for == listed[0].occurrence_at < clock.now() and result.skipped == 4
    assert (await occurrences.get(recurring.id)).skipped == 4
    await occurrences.replace_unfired(await occurrences.get(recurring.id), {"parameter": {"SongId": 9}})
    assert await _listed(timed, recurring) == []
    await occurrences.materialise(recurring.id)
    # both replaced (the overdue 12:05 one and 12:06), now with the new parameter
    replaced = await _listed(timed, recurring)
    assert [(a.occurrence_at, a.parameter) for a in replaced] == [
        (T0 + timedelta(minutes=5), {"SongId": 9}),
        (T0 + timedelta(minutes=6), {"SongId": 9}),
    ]


async def test_one_batch_moves_each_recurring_activity_by_its_own_plan(store: Store) -> None:
    clock = ManualClock(T0 + timedelta(seconds=30))
    timed, occurrences = Store(clock), RecurrenceStore(clock)
    activity_type = await make_activity_type(timed)

    async def make(cron: str) -> r.RecurringActivity:
        schedule = {"cron": cron}
        return await make_recurring(
            timed, activity_type, schedule=schedule, timezone="UTC", planned_until=T0, expand_at=T0
        )

    ahead, first, second, stale = [await make("* * * * *") for _ in range(4)]
    hourly = await make("0 * * * *")
    await occurrences.expand([ahead, stale], lookahead=60)  # both have 12:01 now; stale's read is old
    ahead = await occurrences.get(ahead.id)
    result = await occurrences.expand([ahead, first, second, hourly, stale], lookahead=150)

    assert (result.recurring, result.created, result.stale) == (5, 8, 1)
    after = {ra.id: await occurrences.get(ra.id) for ra in (ahead, first, second, hourly, stale)}
    minute = [T0 + timedelta(minutes=n) for n in range(4)]
    expected = {  # runs, revision, planned_until, next_fire_at, last_occurrence_at
        ahead.id: (3, ahead.revision + 1, minute[3], minute[2], minute[3]),
        first.id: (3, first.revision + 1, minute[3], minute[1], minute[3]),
        second.id: (3, second.revision + 1, minute[3], minute[1], minute[3]),
        hourly.id: (0, hourly.revision + 1, T0, T0 + timedelta(hours=1), None),
        stale.id: (1, stale.revision + 1, minute[1], minute[1], minute[1]),  # moved once, by the first
    }
    for recurring_id, (runs, revision, planned_until, next_fire_at, last) in expected.items():
        ra = after[recurring_id]
        assert (ra.runs, ra.revision, ra.planned_until, ra.next_fire_at, ra.last_occurrence_at) == (
            runs,
            revision,
            planned_until,
            next_fire_at,
            last,
        ), recurring_id
    assert [a.occurrence_at for a in await _listed(timed, stale)] == [minute[1]]
    assert [a.occurrence_at for a in await _listed(timed, ahead)] == minute[1:]


def test_recurring_activities_on_one_schedule_share_its_parsed_form() -> None:
    def recurring(schedule: dict[str, str], timezone: str, revision: int) -> r.RecurringActivity:
        values = recurring_values(schedule=schedule, timezone=timezone)
        ids = {name: uuid.uuid4() for name in ("id", "company_id", "solution_id", "activity_type_id")}
        return r.RecurringActivity(
            **ids, **values, activity_type="t", created_at=T0, updated_at=T0, revision=revision
        )

    one = recurrence_of(recurring({"cron": "*/5 * * * *"}, "UTC", revision=3))
    assert recurrence_of(recurring({"cron": "*/5 * * * *"}, "UTC", revision=8)) is one
    assert recurrence_of(recurring({"cron": "*/5 * * * *"}, "Europe/Paris", revision=3)) is not one
    assert recurrence_of(recurring({"cron": "*/6 * * * *"}, "UTC", revision=3)) is not one
