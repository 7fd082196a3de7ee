"""Recurring activities through the engine: the expander, catch-up after downtime, overlap, real receivers.

Where time matters the engine and the stores share a ManualClock: the test moves time by exactly ten
minutes, then runs the expander (as ``Engine.start`` does before it fires anything) and drains.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY

from oste.domain import records as r
from oste.domain.claims import idempotency_key
from oste.domain.clock import ManualClock, SystemClock
from oste.domain.partitions import ALL_PARTITIONS
from oste.engine import Engine
from oste.engine.expander import Expander, ExpanderConfig
from oste.storage.occurrences import RecurrenceStore
from oste.storage.store import Store
from tests.engine_support import Receiver, fast_config, in_turn, respond
from tests.factories import make_type

pytestmark = pytest.mark.timeout(90)
T0 = datetime(2030, 1, 7, 12, 0, 30, tzinfo=UTC)
"""Half a minute past noon: a per-minute schedule's next occurrence is 12:01."""


class World:
    """A store, an expander and a draining engine sharing one ManualClock."""

    def __init__(self, database_url: str, clock: ManualClock) -> None:
        self.clock = clock
        self.store = Store(clock)
        self.occurrences = RecurrenceStore(clock)
        self.expander = Expander(ExpanderConfig(lookahead=60), self.occurrences, lambda: ALL_PARTITIONS)
        self.engine = Engine(clock=clock, config=fast_config())

    async def recurring(self, activity_type: r.ActivityType, **values: Any) -> r.RecurringActivity:
        now = self.clock.now()
        fields = {
            "schedule": {"cron": "* * * * *"},
            "timezone": "UTC",
            "start_at": None,
            "end_at": None,
            "parameter": {"n": 1},
            "retries": None,
            "priority": 0,
            "object_id": None,
            "paused": False,
            "next_fire_at": None,
            "planned_until": now,
            "expand_at": now,
        }
        return await self.store.create_recurring(activity_type, fields | values)

    async def tick(self, at: datetime) -> int:
        """Move to ``at``, expand, fire what is due; returns how many fired."""
        self.clock.set(at)
        await self.expander.run_once()
        return (await self.engine.drain()).fired

    async def occurrences_of(self, recurring: r.RecurringActivity) -> list[r.Activity]:
        company = await self.store.get_company_by_id(recurring.company_id)
        solution = await self.store.get_solution(company, "songs")
        page = await self.store.list_activities(
            solution, r.ActivityFilter(recurring_activity_id=recurring.id), 1000
        )
        return sorted(page.items, key=lambda a: a.occurrence_at)


@pytest.fixture
async def world(store: Store, database_url: str) -> World:
    return World(database_url, ManualClock(T0))


def minute(n: int) -> datetime:
    return datetime(2030, 1, 7, 12, n, tzinfo=UTC) if n < 60 else datetime(2030, 1, 7, 13, n - 60, tzinfo=UTC)


@pytest.mark.parametrize(("catchup", "fires", "skipped"), [("latest", 1, 9), ("all", 10, 0), ("skip", 0, 10)])
async def test_engine_down_ten_minutes(
    world: World, receiver: Receiver, catchup: str, fires: int, skipped: int
) -> None:
    activity_type = await make_type(world.store, receiver.url + "/tick")
    recurring = await world.recurring(activity_type, catchup=catchup)
    assert await world.tick(T0) == 0  # 12:00:30: the 12:01 occurrence is created ahead of time
    assert await world.tick(minute(1)) == 1
    assert await world.tick(minute(1) + timedelta(seconds=30)) == 0  # 12:02 created ahead, then down
    # ten minutes later (12:11:30): 12:02 (already created) to 12:11 were missed
    fired = await world.tick(minute(11) + timedelta(seconds=30))
    assert fired == fires and len(receiver.hits) == 1 + fires
    stored = await world.store.get_recurring(await _solution(world, recurring), recurring.id)
    missed_skipped = 10 - fires
    assert stored.skipped == missed_skipped == skipped
    occurrences = {a.occurrence_at: a for a in await world.occurrences_of(recurring)}
    expected_fired = {"latest": [minute(11)], "all": [minute(n) for n in range(2, 12)], "skip": []}[catchup]
    fired_at = sorted(
        t for t, a in occurrences.items() if a.state == r.ActivityState.SUCCEEDED and t > minute(1)
    )
    assert fired_at == expected_fired
    assert occurrences[minute(12)].state == r.ActivityState.SCHEDULED  # planning went on from now
    keys = [hit.headers["Idempotency-Key"] for hit in receiver.hits]
    assert keys == [
        idempotency_key(a.id, recurring.id, a.occurrence_at) for a in _by_fire(occurrences, receiver)
    ]
    assert all(hit.headers["webhook-id"] == hit.headers["Idempotency-Key"] for hit in receiver.hits)
    # running again changes nothing: every occurrence exists once
    assert await world.tick(minute(11) + timedelta(seconds=31)) == 0
    assert len(await world.occurrences_of(recurring)) == len(occurrences)


def _by_fire(occurrences: dict[datetime, r.Activity], receiver: Receiver) -> list[r.Activity]:
    by_id = {str(a.id): a for a in occurrences.values()}
    return [by_id[hit.headers["OSTE-Activity-Id"]] for hit in receiver.hits]


async def _solution(world: World, recurring: r.RecurringActivity) -> r.Solution:
    company = await world.store.get_company_by_id(recurring.company_id)
    return await world.store.get_solution(company, "songs")


@pytest.mark.parametrize(("overlap", "created"), [("skip", False), ("allow", True)])
async def test_overlap_skip_while_an_occurrence_is_retrying(
    world: World, receiver: Receiver, overlap: str, created: bool
) -> None:
    receiver.behaviour = in_turn(respond(503, headers={"Retry-After": "300"}), respond(200))
    activity_type = await make_type(world.store, receiver.url + "/tick")
    recurring = await world.recurring(activity_type, overlap=overlap)
    await world.tick(T0)
    assert await world.tick(minute(1)) == 1  # 503 with Retry-After: a retry five minutes later
    retrying = (await world.occurrences_of(recurring))[0]
    assert retrying.state == r.ActivityState.SCHEDULED and retrying.attempts == 1
    assert retrying.next_attempt_at >= minute(6)
    await world.tick(minute(2))
    stored = await world.store.get_recurring(await _solution(world, recurring), recurring.id)
    instants = [a.occurrence_at for a in await world.occurrences_of(recurring)]
    assert (minute(2) in instants) is created
    assert stored.skipped == (0 if created else 1)


async def test_max_runs_and_spread(world: World, receiver: Receiver) -> None:
    activity_type = await make_type(world.store, receiver.url + "/tick")
    recurring = await world.recurring(activity_type, max_runs=2, spread=20.0)
    await world.tick(T0)
    for n in (1, 2, 3, 4):
        await world.tick(minute(n) + timedelta(seconds=25))
    occurrences = await world.occurrences_of(recurring)
    assert [a.occurrence_at for a in occurrences] == [minute(1), minute(2)]
    offsets = {a.scheduled_for - a.occurrence_at for a in occurrences}
    assert len(offsets) == 1 and timedelta(0) <= offsets.pop() < timedelta(seconds=20)  # stable
    stored = await world.store.get_recurring(await _solution(world, recurring), recurring.id)
    assert stored.runs == 2 and stored.expand_at is None and len(receiver.hits) == 2  # planning stopped


async def test_a_running_engine_expands_and_fires_on_time(
    store: Store, database_url: str, receiver: Receiver
) -> None:
    activity_type = await make_type(store, receiver.url + "/every-second")
    now = SystemClock().now()
    recurring = await store.create_recurring(
        activity_type,
        {
            "schedule": {"cron": "* * * * * *"},
            "timezone": "UTC",
            "start_at": None,
            "end_at": None,
            "parameter": {"n": 1},
            "retries": None,
            "priority": 0,
            "object_id": None,
            "paused": False,
            "next_fire_at": None,
            "planned_until": now,
            "expand_at": now,
        },
    )
    engine = Engine(config=fast_config(expander=ExpanderConfig(interval=0.2, lookahead=2)))
    await engine.start()
    try:
        hits = await receiver.wait_for(3, within=20)
    finally:
        await engine.stop(grace=2)
    keys = [hit.headers["Idempotency-Key"] for hit in hits]
    assert len(set(keys)) == len(keys)  # one key per occurrence
    for hit in hits[:3]:
        scheduled = datetime.fromisoformat(hit.headers["OSTE-Scheduled-For"].replace("Z", "+00:00"))
        assert scheduled.microsecond == 0 and hit.at - scheduled.timestamp() < 2.0
        assert hit.headers["Idempotency-Key"] == idempotency_key(None, recurring.id, scheduled)  # type: ignore[arg-type]


async def test_an_occurrence_planned_late_keeps_its_instant_fires_at_once_and_counts_as_late(
    world: World, receiver: Receiver
) -> None:
    # Issue 39, O7: planned late, it was stored due "now": off the schedule's grid, its lateness unseen.
    activity_type = await make_type(world.store, receiver.url + "/tick")
    recurring = await world.recurring(activity_type)  # every minute; nothing planned yet at 12:00:30
    lag_before = REGISTRY.get_sample_value("oste_fire_lag_seconds_sum") or 0.0
    assert await world.tick(minute(1) + timedelta(seconds=3)) == 1  # the expander ran 3 s behind
    occurrence = (await world.occurrences_of(recurring))[0]  # 12:02 is planned ahead of time beside it
    assert (occurrence.occurrence_at, occurrence.scheduled_for) == (minute(1), minute(1))
    assert occurrence.state == r.ActivityState.SUCCEEDED  # fired at once, late as it was
    [hit] = receiver.hits
    assert hit.headers["OSTE-Scheduled-For"] == "2030-01-07T12:01:00Z"
    lag = (REGISTRY.get_sample_value("oste_fire_lag_seconds_sum") or 0.0) - lag_before
    assert lag >= 3.0, lag  # its 3 s of lateness show in the lag figures

    # caught up after downtime (latest): the one kept fires at once, on its instant too
    assert await world.tick(minute(5) + timedelta(seconds=30)) == 1
    [latest] = [a for a in await world.occurrences_of(recurring) if a.occurrence_at == minute(5)]
    assert (latest.occurrence_at, latest.scheduled_for) == (minute(5), minute(5))
    assert latest.state == r.ActivityState.SUCCEEDED
