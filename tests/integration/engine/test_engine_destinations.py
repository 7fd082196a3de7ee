"""Destinations through running engines: a breaker that opens on failures in a row holds activities back
without spending their retries and closes on a probe; 4xx answers never open it; a capped destination
never has more requests in flight than its cap, whichever of two nodes sends them."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from prometheus_client import REGISTRY

from oste.domain import records as r
from oste.domain.clock import SystemClock
from oste.domain.destinations import BreakerPolicy, CircuitState, destination_of
from oste.engine import Engine
from oste.storage.destinations import DestinationStore
from oste.storage.store import Store
from tests.engine_support import (
    Receiver,
    eventually,
    executions_of,
    fast_config,
    reload,
    settled,
)
from tests.factories import make_activities, make_type

pytestmark = pytest.mark.timeout(90)
POLICY = BreakerPolicy(failures=3, cooldown=0.3, max_cooldown=1.0)


def _engine(database_url: str, **changes: object) -> Engine:
    config = dataclasses.replace(fast_config(), breaker=POLICY, **changes)  # type: ignore[arg-type]
    return Engine(config=config)


@pytest.fixture
async def engine(store: Store, database_url: str) -> AsyncIterator[Engine]:
    running = _engine(database_url)
    await running.start()
    try:
        yield running
    finally:
        await running.stop(grace=0.5)


async def test_an_open_breaker_holds_activities_back_with_their_retries_and_a_probe_closes_it(
    store: Store, receiver: Receiver, engine: Engine
) -> None:
    down = True

    async def flaky(request: web.Request, rec: Receiver) -> web.StreamResponse:
        return web.Response(status=503 if down else 200, text="down" if down else "ok")

    receiver.behaviour = flaky
    destinations = DestinationStore(SystemClock())
    where = destination_of(receiver.url)
    activity_type = await make_type(store, receiver.url + "/s/{n}", retries=3)
    await make_activities(store, activity_type, SystemClock().now(), count=3)

    async def opened() -> bool:  # the company's own breaker: one company's 503s open no one else's
        rows = {d.destination: d for d in await destinations.active_companies()}
        return where in rows and rows[where].state != CircuitState.CLOSED

    await eventually(opened, within=20, what="the breaker opening")
    assert all(d.destination != where for d in await destinations.active())

    async def shown() -> bool:  # on /metrics once the node read it back
        value = REGISTRY.get_sample_value("oste_destination_company_circuits", {"destination": where})
        return value == 1.0

    await eventually(shown, within=5, what="the open circuit on /metrics")
    sent_when_opened = len(receiver.hits)
    waiting = await make_activities(store, activity_type, SystemClock().now(), count=20)

    async def all_deferred() -> bool:
        for activity in waiting:
            if not any(e.outcome == r.Outcome.DEFERRED for e in await executions_of(store, activity)):
                return False
        return True

    await eventually(all_deferred, within=20, what="every new activity deferred")
    # While down the receiver saw only probes (the cool-down doubles: 0.3 s, 0.6 s, then 1 s).
    probes = len(receiver.hits) - sent_when_opened
    assert probes <= 6, f"{probes} requests reached the receiver while its breaker was open"
    for activity in waiting:  # nothing spent while waiting: only a request sent (a probe) spends one
        current = await reload(store, activity)
        sent = [e for e in await executions_of(store, activity) if e.outcome != r.Outcome.DEFERRED]
        assert current.attempts == len(sent) <= 1 and current.retries == 3 - len(sent), current
    down = False
    for activity in waiting:
        done = await settled(store, activity, within=20)
        assert done.state == r.ActivityState.SUCCEEDED
        assert done.attempts <= 2 and done.retries == 4 - done.attempts, done
        executions = await executions_of(store, activity)
        deferred = [e for e in executions if e.outcome == r.Outcome.DEFERRED]
        assert deferred and all(
            "circuit" in (e.error or "") and "no retry was spent" in (e.error or "") for e in deferred
        )
        assert [e.outcome for e in executions if e.outcome != r.Outcome.DEFERRED][-1:] == [r.Outcome.OK]
    assert not await opened()


async def test_client_errors_never_open_a_breaker(store: Store, receiver: Receiver, engine: Engine) -> None:
    async def missing(request: web.Request, rec: Receiver) -> web.StreamResponse:
        return web.Response(status=404, text="no such song")

    receiver.behaviour = missing
    activity_type = await make_type(store, receiver.url + "/s/{n}", retries=0)
    activities = await make_activities(store, activity_type, SystemClock().now(), count=10)
    for activity in activities:
        assert (await settled(store, activity)).state == r.ActivityState.DEAD
    rows = await DestinationStore(SystemClock()).active()
    assert all(row.destination != destination_of(receiver.url) for row in rows)
    assert len(receiver.hits) == 10


async def test_two_nodes_never_have_more_in_flight_than_the_destination_cap(
    store: Store, receiver: Receiver, database_url: str
) -> None:
    open_now = peak = 0

    async def counting(request: web.Request, rec: Receiver) -> web.StreamResponse:
        nonlocal open_now, peak
        open_now += 1
        peak = max(peak, open_now)
        try:
            await asyncio.sleep(0.05)  # the receiver's work, so requests overlap
            return web.Response(text="ok")
        finally:
            open_now -= 1

    receiver.behaviour = counting
    cap = 3
    await DestinationStore(SystemClock()).set_cap(destination_of(receiver.url), cap)
    nodes = [_engine(database_url), _engine(database_url)]
    for node in nodes:
        await node.start()
    try:
        # Several companies and types: the cap is the destination's, across all of them.
        activity_types = [
            await make_type(store, receiver.url + f"/{company}/{{n}}", company=company)
            for company in ("one", "two", "three")
        ]
        activities = []
        for activity_type in activity_types:
            activities += await make_activities(store, activity_type, SystemClock().now(), count=20)
        for activity in activities:
            assert (await settled(store, activity, within=30)).state == r.ActivityState.SUCCEEDED
    finally:
        for node in nodes:
            await node.stop(grace=0.5)
    assert peak <= cap, f"{peak} requests were in flight at once; the cap is {cap}"
    assert peak >= 2, "the requests never overlapped: the test proves nothing"
    assert {n.node.id for n in nodes if n.node} and len(receiver.hits) == 60


async def test_companies_share_a_capped_destination_fairly(
    store: Store, receiver: Receiver, database_url: str
) -> None:
    """A tenant with a backlog parked behind a destination's cap does not hold back another tenant's
    few activities for the same destination: each freed slot goes to whoever holds fewest."""

    async def slow(request: web.Request, rec: Receiver) -> web.StreamResponse:
        await asyncio.sleep(0.1)
        return web.Response(text="ok")

    receiver.behaviour = slow
    await DestinationStore(SystemClock()).set_cap(destination_of(receiver.url), 2)
    node = _engine(database_url)
    await node.start()
    try:
        hog = await make_type(store, receiver.url + "/hog/{n}", company="hog")
        calm = await make_type(store, receiver.url + "/calm/{n}", company="calm")
        await make_activities(store, hog, SystemClock().now(), count=200)
        await receiver.wait_for(4, within=10)  # the hog's backlog is claimed and parked behind the cap
        mine = await make_activities(store, calm, SystemClock().now(), count=6)
        for activity in mine:
            assert (await settled(store, activity, within=20)).state == r.ActivityState.SUCCEEDED
        hog_hits = sum(1 for hit in receiver.hits if hit.path.startswith("/hog/"))
    finally:
        await node.stop(grace=0.5)
    # The calm tenant's six took about three turns of the two slots, the hog held the other half.
    assert hog_hits <= 30, f"the hog got {hog_hits} requests before the calm tenant's 6 were done"
