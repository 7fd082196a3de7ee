"""StatsStore and StatsService on both databases: rollups add up per key, counts stop at the cap, rollups
are pruned, and limited types' due activities count as throttled."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from oste.domain.stats import DestinationRollup, Rollup, minute_of
from oste.storage import stats as stats_module
from oste.storage.stats import HEALTH_MINUTES, StatsService, StatsStore, destination_health
from oste.storage.store import Store
from tests.factories import make_activities, make_type


async def test_rollups_add_up_per_key_and_old_ones_are_pruned(store: Store) -> None:
    activity_type = await make_type(store, "https://r.example/{SongId}")
    now = store.clock.now()
    minute = minute_of(now)

    def rollup(at: int, outcome: int, lag: float) -> Rollup:
        one = Rollup(at, activity_type.company_id, activity_type.solution_id, activity_type.id)
        one.add(outcome, lag)
        return one

    writer = StatsStore()
    await writer.write_rollups([rollup(minute, 0, 0.02), rollup(minute - 2000, 0, 1.0)])
    await writer.write_rollups([rollup(minute, 0, 0.3), rollup(minute, 1, 0.001)])  # the same key again
    company = await store.get_company("acme")
    report = await StatsService(store.clock).solution(company, await store.get_solution(company, "songs"))
    window = report.windows["1m"]
    assert window.outcome_counts() == {
        "ok": 2,
        "failed": 1,
        "retry": 0,
        "error": 0,
        "snoozed": 0,
        "expired": 0,
    }
    assert window.lag_max == pytest.approx(0.3)
    assert report.windows["1h"].outcome_counts()["ok"] == 2  # the old minute is outside the hour
    await writer.prune(minute - 1000)
    names = await writer.type_names([activity_type.id, uuid.uuid4()])
    assert names == {activity_type.id: ("acme", "songs", activity_type.name)}


async def test_destination_rollups_add_up_per_key_read_per_company_and_are_pruned(store: Store) -> None:
    now = store.clock.now()
    minute = minute_of(now)
    a, b = uuid.uuid4(), uuid.uuid4()
    here, there = "https://r.example:443", "https://s.example:443"

    def used(
        at: int, company: uuid.UUID, failed: bool, seconds: float, where: str = here
    ) -> DestinationRollup:
        one = DestinationRollup(at, where, company)
        one.add(failed, seconds)
        return one

    writer = StatsStore()
    await writer.write_destination_rollups(
        [
            used(minute, a, False, 0.02),
            used(minute - HEALTH_MINUTES - 5, a, True, 9.0),
            used(minute, b, True, 1.5),
        ]
    )
    await writer.write_destination_rollups(
        [used(minute, a, True, 0.2), used(minute - 1, a, False, 0.01, there)]
    )
    mine = await destination_health([here, there], a, now)
    assert (mine[here].attempts, mine[here].failed, mine[here].error_rate) == (2, 1, 0.5)
    assert mine[here].latency_max == pytest.approx(0.2)  # the old minute is outside the hour
    assert mine[there].attempts == 1
    every = await destination_health([here], None, now)
    assert (every[here].attempts, every[here].failed, every[here].latency_max) == (3, 2, pytest.approx(1.5))
    assert await destination_health(["https://never.example:443"], None, now) == {}
    await writer.prune(minute)
    assert (await destination_health([here, there], a, now))[here].attempts == 2
    assert there not in await destination_health([here, there], a, now)  # its minute was pruned


async def test_queue_counts_stop_at_the_cap_and_limited_types_count_as_throttled(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    activity_type = await make_type(store, "https://r.example/{SongId}", max_concurrency=1)
    now = store.clock.now()
    await make_activities(store, activity_type, now - timedelta(seconds=5), count=3)
    await make_activities(store, activity_type, now + timedelta(hours=1), count=3)
    company = await store.get_company("acme")
    solution = await store.get_solution(company, "songs")
    report = await StatsService(store.clock).activity_type(company, solution, activity_type)
    assert (report.queue.due.value, report.queue.future.value) == (3, 3)
    assert report.throttled.limited.value == 3 and report.throttled.paused.value == 0
    monkeypatch.setattr(stats_module, "COUNT_CAP", 2)
    monkeypatch.setattr(stats_module, "DUE_SCAN", 2)
    capped = await StatsService(store.clock).company(company)
    assert (capped.queue.due.value, capped.queue.due.at_least) == (2, True)
    assert (capped.throttled.limited.value, capped.throttled.limited.at_least) == (2, True)
    assert capped.queue.future.at_least is True  # scheduled and due both stopped at the cap
    assert capped.queue.dead.at_least is False
    deployment = await StatsService(store.clock).deployment()
    assert (deployment.queue.due.value, deployment.queue.due.at_least) == (2, True)
