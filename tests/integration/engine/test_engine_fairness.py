"""QoS through the running engine: a slow, busy tenant does not starve another; type limits hold."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from aiohttp import web

from oste.domain import records as r
from oste.domain.clock import SystemClock
from oste.engine import Engine
from oste.engine.config import ExecutorConfig
from oste.storage.store import Store
from tests.engine_support import LOOPBACK, Receiver, eventually, fast_config, settled, stall
from tests.factories import make_activities, make_type

pytestmark = pytest.mark.timeout(60)
SLOTS = 4


@pytest.fixture
async def engine(store: Store, database_url: str) -> AsyncIterator[Engine]:
    config = fast_config(executor=ExecutorConfig(max_in_flight=SLOTS, allowed_targets=LOOPBACK))
    running = Engine(config=config)
    await running.start()
    try:
        yield running
    finally:
        await running.stop(grace=0.5)


async def test_a_slow_tenant_with_a_backlog_does_not_starve_another(
    store: Store, receiver: Receiver, engine: Engine
) -> None:
    slow = stall(0.5)

    async def by_tenant(request: web.Request, rec: Receiver) -> web.StreamResponse:
        if request.path.startswith("/hog/"):
            return await slow(request, rec)
        return web.Response(text="ok")

    receiver.behaviour = by_tenant
    hog = await make_type(store, receiver.url + "/hog/{n}", company="hog")
    calm = await make_type(store, receiver.url + "/calm/{n}", company="calm")
    now = SystemClock().now()
    await make_activities(store, hog, now, count=700)  # more than a node's waiting room holds
    await receiver.wait_for(SLOTS, within=10)  # the hog holds every slot, its backlog is queued
    mine = await make_activities(store, calm, SystemClock().now(), count=6)
    for activity in mine:
        assert (await settled(store, activity, within=10)).state == r.ActivityState.SUCCEEDED
    hog_hits = sum(1 for hit in receiver.hits if hit.path.startswith("/hog/"))
    # Every freed slot went to the calm tenant first: its six needed about two slots' turns.
    assert hog_hits <= 3 * SLOTS, f"the hog got {hog_hits} requests before the calm tenant's 6 were done"


async def test_max_concurrency_caps_requests_in_flight_of_a_type(
    store: Store, receiver: Receiver, engine: Engine
) -> None:
    open_now = 0
    peak = 0

    async def counting(request: web.Request, rec: Receiver) -> web.StreamResponse:
        nonlocal open_now, peak
        open_now += 1
        peak = max(peak, open_now)
        try:
            await asyncio.sleep(0.1)  # the receiver's work, so requests overlap
            return web.Response(text="ok")
        finally:
            open_now -= 1

    receiver.behaviour = counting
    activity_type = await make_type(store, receiver.url + "/c/{n}", max_concurrency=2)
    activities = await make_activities(store, activity_type, SystemClock().now(), count=12)
    for activity in activities:
        assert (await settled(store, activity)).state == r.ActivityState.SUCCEEDED
    assert peak == 2


async def test_rate_limit_paces_the_starts_of_a_type(
    store: Store, receiver: Receiver, engine: Engine
) -> None:
    activity_type = await make_type(store, receiver.url + "/r/{n}", rate_limit=5.0)
    await make_activities(store, activity_type, SystemClock().now() + timedelta(milliseconds=300), count=15)
    hits = await receiver.wait_for(15, within=15)
    first = hits[0].at
    for index, hit in enumerate(hits):
        # a burst of one second's worth (5), then one every 0.2 s
        earliest = max(0, index - 4) / 5.0
        assert hit.at - first >= earliest - 0.05, f"request {index + 1} came {hit.at - first:.3f} s in"

    async def all_done() -> bool:
        return len(receiver.hits) == 15

    await eventually(all_done, within=5)


async def test_due_activities_go_highest_priority_first(
    store: Store, receiver: Receiver, engine: Engine
) -> None:
    activity_type = await make_type(store, receiver.url + "/p/{n}", max_concurrency=1)
    activity_type = await store.update_activity_type(activity_type, {"paused": True})
    due = SystemClock().now()
    for n, priority in enumerate((1, 5, 3, 9, 7, 2)):
        await make_activities(store, activity_type, due, parameter={"n": n}, priority=priority)
    await store.update_activity_type(activity_type, {"paused": False})  # all six are due at once now
    hits = await receiver.wait_for(6, within=15)
    # n of the priorities 9, 7, 5, 3, 2, 1: the first to go is the highest, not the first created
    assert [hit.path for hit in hits] == [f"/p/{n}" for n in (3, 4, 1, 2, 5, 0)]
