"""Catch-up for occurrences already in the store (issue 12, defect 4).

Occurrences are created ahead of time (the lookahead). When the engine then stops before they fall due
and starts after, they are stored, unfired and late: the catch-up policy must decide for them too, before
anything can claim them, as it does for occurrences it never created. The same holds for an engine that
kept running but fell behind (its expander runs, nothing drained them in time).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from oste.domain import records as r
from oste.domain.clock import ManualClock
from oste.domain.partitions import ALL_PARTITIONS
from oste.engine import Engine
from oste.engine.expander import Expander, ExpanderConfig
from oste.storage.occurrences import RecurrenceStore
from oste.storage.store import Store
from tests.engine_support import Receiver, fast_config
from tests.factories import make_type

pytestmark = pytest.mark.timeout(90)
T0 = datetime(2030, 1, 7, 12, 0, 0, tzinfo=UTC)
FIRST = T0 + timedelta(seconds=10)
INSTANTS = [FIRST + timedelta(seconds=2 * n) for n in range(4)]
"""Four occurrences two seconds apart (12:00:10, :12, :14, :16), then the schedule ends."""


async def _recurring(
    store: Store, clock: ManualClock, activity_type: r.ActivityType, **values: Any
) -> r.RecurringActivity:
    now = clock.now()
    fields = {
        "schedule": {"cron": "*/2 * * * * *"},
        "timezone": "UTC",
        "start_at": FIRST,
        "end_at": INSTANTS[-1],
        "parameter": {"n": 1},
        "retries": None,
        "priority": 0,
        "object_id": None,
        "paused": False,
        "next_fire_at": None,
        "planned_until": now,
        "expand_at": now,
    }
    return await store.create_recurring(activity_type, fields | values)


async def _stored(
    store: Store, recurring: r.RecurringActivity
) -> tuple[r.RecurringActivity, list[r.Activity]]:
    company = await store.get_company_by_id(recurring.company_id)
    solution = await store.get_solution(company, "songs")
    page = await store.list_activities(solution, r.ActivityFilter(recurring_activity_id=recurring.id), 100)
    return await store.get_recurring(solution, recurring.id), sorted(
        page.items, key=lambda a: a.occurrence_at
    )


@pytest.mark.parametrize(
    ("policy", "fired"),
    [
        ({"catchup": "latest"}, [INSTANTS[-1]]),
        ({"catchup": "all"}, INSTANTS),
        ({"catchup": "skip"}, []),
        ({"catchup": "all", "catchup_window": 20.0}, INSTANTS[2:]),  # :10 and :12 are older than 20 s at :34
    ],
    ids=["latest", "all", "skip", "all-window"],
)
async def test_stored_occurrences_missed_while_down_follow_the_catchup_policy(
    store: Store, database_url: str, receiver: Receiver, policy: dict[str, Any], fired: list[datetime]
) -> None:
    clock = ManualClock(T0)
    activity_type = await make_type(store, receiver.url + "/tick")
    recurring = await _recurring(store, clock, activity_type, **policy)
    expander = Expander(ExpanderConfig(lookahead=60), RecurrenceStore(clock), lambda: ALL_PARTITIONS)
    await expander.run_once()  # all four created ahead of time, then the engine stops
    _, created = await _stored(store, recurring)
    assert [a.occurrence_at for a in created] == INSTANTS
    clock.set(INSTANTS[-1] + timedelta(seconds=18))  # started again well after the last one was missed
    engine = Engine(clock=clock, config=fast_config())
    result = await expander.run_once()  # what Engine.start does before its poller claims anything
    drained = await engine.drain()
    assert drained.fired == len(fired) == len(receiver.hits)
    stored, occurrences = await _stored(store, recurring)
    states = {a.occurrence_at: a.state for a in occurrences}
    assert [t for t, s in states.items() if s == r.ActivityState.SUCCEEDED] == fired
    assert [t for t, s in states.items() if s == r.ActivityState.CANCELLED] == [
        t for t in INSTANTS if t not in fired
    ]
    assert stored.skipped == result.skipped == len(INSTANTS) - len(fired)
    again = await expander.run_once()  # nothing more to decide
    assert (again.planned, again.created, again.cancelled, again.skipped) == (0, 0, 0, 0)


async def test_a_worker_that_fell_behind_coalesces_under_latest(
    store: Store, database_url: str, receiver: Receiver
) -> None:
    """The expander kept running but nothing claimed: occurrences late by more than the grace are
    missed and coalesce into the latest; one still within the grace fires as usual."""
    clock = ManualClock(T0)
    activity_type = await make_type(store, receiver.url + "/tick")
    recurring = await _recurring(store, clock, activity_type)
    expander = Expander(ExpanderConfig(lookahead=60), RecurrenceStore(clock), lambda: ALL_PARTITIONS)
    engine = Engine(clock=clock, config=fast_config())
    for second in range(0, 22):  # the expander ticks every second; the poller is stuck
        clock.set(T0 + timedelta(seconds=second))
        await expander.run_once()
    # at 12:00:21 :10, :12 and :14 are later than the 5 s grace (missed), :16 is not
    assert (await engine.drain()).fired == 2
    stored, occurrences = await _stored(store, recurring)
    fired = [a.occurrence_at for a in occurrences if a.state == r.ActivityState.SUCCEEDED]
    assert fired == [INSTANTS[2], INSTANTS[3]] and stored.skipped == 2
