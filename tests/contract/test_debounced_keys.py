"""The keys of debounced creates stay bounded (issue 34), on SQLite and PostgreSQL: an activity keeps
the newest ``DEBOUNCED_KEYS_KEPT`` keys debounced into it, and every path that deletes activities (the
log shippers' purge, a bulk delete, the deletion of a type, solution or company, a recurring activity's
re-plan and resume) deletes the keys debounced into them, and no one else's."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest

from oste.domain import records as r
from oste.domain.clock import ManualClock
from oste.domain.partitions import ALL_PARTITIONS
from oste.storage import models as m
from oste.storage.bulk import BulkChange
from oste.storage.dispatch import DispatchStore
from oste.storage.log_shipping import LogShippingStore
from oste.storage.occurrences import RecurrenceStore
from oste.storage.on_new import DEBOUNCED_KEYS_KEPT
from oste.storage.store import Store
from tests.contract.test_dispatch_store import ok
from tests.factories import T0, make_activity_type, make_recurring, make_solution, new_activity

pytestmark = pytest.mark.timeout(120)
DEBOUNCE = r.PerObject(on_new="debounce", max_wait=86400.0)


async def debounce_type(store: Store, solution: r.Solution | None = None) -> r.ActivityType:
    return await make_activity_type(store, solution, per_object=DEBOUNCE)


def create(
    activity_type: r.ActivityType, song: int, key: str | None = None, at: float = 0.0
) -> r.NewActivity:
    """A create of ``song`` due ``at`` seconds after T0 (its body's hash: the key, so a replay matches)."""
    item = new_activity(activity_type, T0 + timedelta(seconds=at), parameter={"SongId": song, "at": at})
    return dataclasses.replace(item, idempotency_key=key, request_hash=key)


async def keys_of(activity_id: object = None) -> int:
    """Rows of ``debounced_key`` (of one activity, or all)."""
    rows = m.DebouncedKey.all() if activity_id is None else m.DebouncedKey.filter(activity_id=activity_id)
    return await rows.count()


async def debounced_once(store: Store, activity_type: r.ActivityType, song: int, key: str) -> r.Activity:
    """A pending activity of ``song`` with one create debounced into it under ``key``."""
    first = await store.create_activity(create(activity_type, song, at=10))
    done = await store.create_activity(create(activity_type, song, key, at=20))
    assert done.debounced and done.activity.id == first.activity.id
    return done.activity


async def test_an_activity_keeps_only_its_newest_debounced_keys(store: Store) -> None:
    activity_type = await debounce_type(store)
    first = (await store.create_activity(create(activity_type, 1, at=0))).activity
    extra = 50
    for n in range(DEBOUNCED_KEYS_KEPT + extra):
        done = await store.create_activity(create(activity_type, 1, f"k{n}", at=n + 1))
        assert done.debounced and done.activity.id == first.id
        assert await keys_of() == min(n + 1, DEBOUNCED_KEYS_KEPT)
    kept = set(await m.DebouncedKey.all().values_list("idempotency_key", flat=True))
    assert kept == {f"k{n}" for n in range(extra, DEBOUNCED_KEYS_KEPT + extra)}
    newest = DEBOUNCED_KEYS_KEPT + extra - 1
    replay = await store.create_activity(
        create(activity_type, 1, f"k{extra}", at=extra + 1)
    )  # the oldest kept
    assert replay.debounced and replay.activity.scheduled_for == T0 + timedelta(seconds=newest + 1)  # unmoved
    assert await keys_of() == DEBOUNCED_KEYS_KEPT
    forgotten = await store.create_activity(
        create(activity_type, 1, "k0", at=1)
    )  # debounced again, as a new create
    assert forgotten.debounced and forgotten.activity.scheduled_for == T0 + timedelta(seconds=1)
    assert await keys_of() == DEBOUNCED_KEYS_KEPT


async def test_a_tenant_that_keeps_debouncing_and_firing_stays_bounded(
    store: Store, dispatch: DispatchStore, clock: ManualClock
) -> None:
    """Round after round an object's activity takes more debounced creates than it keeps, fires, and
    is purged by the log shippers: the table never holds more than one activity's worth, and nothing
    once the last is purged."""
    activity_type = await debounce_type(store)
    shippers = LogShippingStore(clock)
    for round_ in range(3):
        at = round_ * 1000.0
        pending = (await store.create_activity(create(activity_type, 1, at=at))).activity
        for n in range(DEBOUNCED_KEYS_KEPT + 20):
            done = await store.create_activity(create(activity_type, 1, f"r{round_}-{n}", at=at + n))
            assert done.activity.id == pending.id
        assert await keys_of() == await keys_of(pending.id) == DEBOUNCED_KEYS_KEPT
        [claim] = await dispatch.claim_due("n1", ALL_PARTITIONS, 10, 30, T0 + timedelta(seconds=at + 999))
        assert (await dispatch.complete([ok(claim, T0 + timedelta(seconds=at + 999))])).applied == 1
        assert await keys_of() == DEBOUNCED_KEYS_KEPT  # a replay still answers the activity that fired
        assert await shippers.purge([pending.id], [r.ActivityState.SUCCEEDED]) == 1
        assert await keys_of() == 0


Deletion = Callable[[Store, r.Solution, r.ActivityType], Awaitable[None]]


async def bulk_delete(store: Store, solution: r.Solution, activity_type: r.ActivityType) -> None:
    assert (await BulkChange(store.clock).run(solution, r.ActivityFilter(), "delete")).changed == 1


async def delete_type(store: Store, solution: r.Solution, activity_type: r.ActivityType) -> None:
    await store.delete_activity_type(activity_type, cascade=True)


async def delete_solution(store: Store, solution: r.Solution, activity_type: r.ActivityType) -> None:
    await store.delete_solution(solution, cascade=True)


async def delete_company(store: Store, solution: r.Solution, activity_type: r.ActivityType) -> None:
    await store.delete_company(await store.get_company_by_id(solution.company_id), cascade=True)


@pytest.mark.parametrize("deletion", [bulk_delete, delete_type, delete_solution, delete_company])
async def test_deleting_activities_deletes_the_keys_debounced_into_them(
    store: Store, deletion: Deletion
) -> None:
    solution = await make_solution(store)
    activity_type, bystander = await debounce_type(store, solution), await debounce_type(store)
    doomed = await debounced_once(store, activity_type, 1, "doomed")
    kept = await debounced_once(store, bystander, 1, "kept")  # another company's
    assert await keys_of() == 2
    await deletion(store, solution, activity_type)
    assert not await m.Activity.filter(id=doomed.id).exists()
    assert await keys_of(doomed.id) == 0
    assert await keys_of(kept.id) == 1


@pytest.mark.parametrize("change", ["replace_unfired", "resume"])
async def test_re_planning_or_resuming_a_recurring_activity_deletes_the_keys_of_its_occurrences(
    store: Store, change: str
) -> None:
    clock = ManualClock(T0 + timedelta(seconds=30))
    timed, occurrences = Store(clock), RecurrenceStore(clock)
    activity_type = await debounce_type(timed)
    recurring = await make_recurring(
        timed, activity_type, schedule={"cron": "* * * * *"}, timezone="UTC", planned_until=T0, expand_at=T0
    )
    await occurrences.expand([recurring], lookahead=60)  # one occurrence of SongId 7, at 12:01
    done = await timed.create_activity(create(activity_type, 7, "into-an-occurrence", at=90))
    assert done.debounced and done.activity.recurring_activity_id == recurring.id
    assert await keys_of(done.activity.id) == 1
    if change == "replace_unfired":
        await occurrences.replace_unfired(await occurrences.get(recurring.id), {"parameter": {"SongId": 7}})
    else:
        await occurrences.pause(await occurrences.get(recurring.id))  # cancels it: the key stays
        assert await keys_of(done.activity.id) == 1
        await occurrences.resume(await occurrences.get(recurring.id))  # deletes the cancelled one
    assert not await m.Activity.filter(id=done.activity.id).exists()
    assert await keys_of(done.activity.id) == 0
