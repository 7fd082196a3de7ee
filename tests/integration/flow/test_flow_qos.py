"""Per-object flow control under the deployment's QoS (issue 34): what per-object control lets through
still obeys the type's ``max_concurrency``, the activities' ``priority``, and the company's circuit
breaker at the destination, with each object's order kept. A real server with its engine, a real
receiver, SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.engine_support import Receiver, eventually, test_settings
from tests.integration.api.conftest import Api, Tenant, api_client
from tests.integration.flow.test_flow_delivery import Watch, all_ended, body, created, watching
from tests.security.test_outbound_slots import (  # noqa: F401 (fixtures)
    ALONE,
    DEADLINE,
    SLOTS,
    count,
    create,
    engine_api,
    release,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def qos_api(database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    """A server with its engine whose circuit breakers cool down in half a second."""
    settings = dataclasses.replace(
        test_settings(database_url),
        data_dir=tmp_path,
        poll_interval=0.2,
        breaker_cooldown=0.5,
        breaker_max_cooldown=1.0,
    )
    async with api_client(settings, run_engine=True) as client:
        yield client


async def fifo_type(api: Api, receiver: Receiver, **fields: Any) -> Tenant:
    return await api.tenant(
        uri_pattern=receiver.url + "/song/{SongId}",
        object_id_ref=["SongId"],
        per_object={"order": "fifo"},
        retries=10,
        backoff_base="PT0.1S",
        backoff_max="PT0.2S",
        **fields,
    )


def counting_total(watch: Watch, answer: Any, most: list[int]) -> Any:
    """``watching``, keeping in ``most[0]`` the most requests in flight at once over every object."""
    inner = watching(watch, answer)

    async def behaviour(request: web.Request, receiver: Receiver) -> web.StreamResponse:
        most[0] = max(most[0], sum(watch.in_flight.values()) + 1)
        return await inner(request, receiver)

    return behaviour


async def test_the_types_max_concurrency_bounds_every_object_together(
    qos_api: Api, receiver: Receiver
) -> None:
    api, watch, most = qos_api, Watch(), [0]
    receiver.behaviour = counting_total(watch, lambda song, n, attempt: (0.15, 200), most)
    tenant = await fifo_type(api, receiver, max_concurrency=3, breaker_failures=0)
    now = datetime.now(UTC)
    await created(
        api,
        tenant,
        [body(tenant, song, n, now + timedelta(milliseconds=n)) for song in range(10) for n in range(3)],
    )
    await all_ended(api, tenant, 30, within=90)
    assert most[0] == 3  # the type's limit reached, never passed, across objects
    assert max(watch.most.values()) == 1  # and each object one at a time
    assert all(watch.arrivals[song] == [0, 1, 2] for song in range(10))


async def test_higher_priority_objects_go_first(qos_api: Api, receiver: Receiver) -> None:
    api, watch, order = qos_api, Watch(), []
    inner = watching(watch, lambda song, n, attempt: (0.05, 200))

    async def in_order(request: web.Request, receiver_: Receiver) -> web.StreamResponse:
        order.append(int(request.path.rsplit("/", 1)[1]))  # /song/{SongId}
        return await inner(request, receiver_)

    receiver.behaviour = in_order
    tenant = await fifo_type(api, receiver, max_concurrency=1, breaker_failures=0)
    activity_type = f"{tenant.types}/{tenant.activity_type}"
    await api.patch(activity_type, {"paused": True}, expect=200)  # everything is due before the first is sent
    now = datetime.now(UTC) - timedelta(seconds=1)
    bodies = [
        {**body(tenant, song, n, now + timedelta(milliseconds=n)), "priority": 9 if song >= 5 else 0}
        for song in range(10)
        for n in range(2)
    ]
    await created(api, tenant, bodies)
    await api.patch(activity_type, {"paused": False}, expect=200)
    await all_ended(api, tenant, 20, within=60)
    assert sorted(order[:5]) == [5, 6, 7, 8, 9], order  # the priority-9 objects' heads before any other
    assert all(watch.arrivals[song] == [0, 1] for song in range(10))


async def test_an_open_breaker_holds_back_objects_in_their_order(qos_api: Api, receiver: Receiver) -> None:
    api, watch = qos_api, Watch()
    down = [True]
    receiver.behaviour = watching(watch, lambda song, n, attempt: (0.0, 503 if down[0] else 200))
    tenant = await fifo_type(api, receiver, breaker_failures=3)
    now = datetime.now(UTC)
    await created(
        api,
        tenant,
        [body(tenant, song, n, now + timedelta(milliseconds=n)) for song in range(4) for n in range(3)],
    )

    async def deferred() -> bool:
        runs = []
        for item in await api.all_items(tenant.activities):
            runs += await api.all_items(f"{tenant.activities}/{item['id']}/executions")
        return any(run["outcome"] == "deferred" for run in runs)

    await eventually(deferred, 30, what="activities held back by the company's open breaker")
    down[0] = False
    await all_ended(api, tenant, 12, within=90)
    assert max(watch.most.values()) == 1
    for song in range(4):  # a failed attempt repeats its activity; the order never goes back
        arrivals = watch.arrivals[song]
        assert arrivals == sorted(arrivals) and set(arrivals) == {0, 1, 2}


async def test_companies_share_the_slots_by_weight_with_fifo_objects(
    engine_api: Api,  # noqa: F811 (the fixtures imported)
    receiver: Receiver,
    release: asyncio.Event,  # noqa: F811
) -> None:
    """Company weights apply to what per-object control lets through: two companies whose FIFO objects
    hang at their receivers, weights 3 and 1, hold a node's slots by weight (each object one at a
    time), and a third company's work still goes at once."""
    api = engine_api
    fifo = {"object_id_ref": ["SongId"], "per_object": {"order": "fifo"}, "retries": 0, "timeout": "PT5M"}
    heavy_company = await api.company(qos_level=3)
    heavy = await tenant_with(api, heavy_company["name"], receiver.url + "/hog/heavy/{SongId}", **fifo)
    light = await api.tenant(uri_pattern=receiver.url + "/hog/light/{SongId}", **fifo)
    calm = await api.tenant(uri_pattern=receiver.url + "/calm/{SongId}", retries=0)
    for tenant in (heavy, light):  # 20 objects, two activities each: only the heads may go
        await create_objects(api, tenant, objects=20, each=2)
    await receiver.wait_for(ALONE, within=DEADLINE)
    await create(api, calm, 0, 5)

    async def calm_done() -> bool:
        return await count(api, calm, "succeeded") == 5

    await eventually(calm_done, within=DEADLINE, every=0.1, what="the third company's work succeeded")
    heads = [hit.path for hit in receiver.hits if hit.path.startswith("/hog/")]
    assert len(heads) == len(set(heads)), heads  # never a second request of one object
    held_heavy = sum(1 for path in heads if path.startswith("/hog/heavy/"))
    held_light = sum(1 for path in heads if path.startswith("/hog/light/"))
    assert ALONE <= held_heavy + held_light < SLOTS, (held_heavy, held_light)
    assert held_heavy >= 4 and held_light >= 1, (held_heavy, held_light)


async def tenant_with(api: Api, company: str, uri_pattern: str, **fields: Any) -> Tenant:
    key = await api.api_key(company)
    solution = await api.solution(company)
    path = f"/v1/companies/{company}/solutions/{solution['name']}"
    activity_type = await api.activity_type(path, uri_pattern=uri_pattern, **fields)
    return Tenant(company, solution["name"], activity_type["name"], key, path)


async def create_objects(api: Api, tenant: Tenant, objects: int, each: int) -> None:
    now = datetime.now(UTC)
    items = [
        {**tenant.activity(song), "scheduled_for": (now + timedelta(milliseconds=n)).isoformat()}
        for song in range(objects)
        for n in range(each)
    ]
    await api.post(tenant.activities, {"activities": items}, token=tenant.key, expect=201)


async def test_a_destinations_cap_bounds_every_object_together(
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    """The destination's cap on requests in flight (here the deployment's default, 2) holds across a
    FIFO type's objects, each object still one at a time and in order."""
    settings = dataclasses.replace(
        test_settings(database_url), data_dir=tmp_path, poll_interval=0.2, destination_max_in_flight=2
    )
    async with api_client(settings, run_engine=True) as api:
        watch, most = Watch(), [0]
        receiver.behaviour = counting_total(watch, lambda song, n, attempt: (0.15, 200), most)
        tenant = await fifo_type(api, receiver, breaker_failures=0)
        now = datetime.now(UTC)
        await created(
            api,
            tenant,
            [body(tenant, song, n, now + timedelta(milliseconds=n)) for song in range(8) for n in range(3)],
        )
        await all_ended(api, tenant, 24, within=90)
    assert most[0] == 2  # the destination's cap reached, never passed, across objects
    assert max(watch.most.values()) == 1
    assert all(watch.arrivals[song] == [0, 1, 2] for song in range(8))


async def test_a_types_rate_limit_paces_every_object_together(qos_api: Api, receiver: Receiver) -> None:
    """The type's ``rate_limit`` (4 a second, a second's worth at once) paces what the FIFO objects let
    through: twelve requests over six objects take at least (12 - 4) / 4 = 2 s, in order per object."""
    api, watch = qos_api, Watch()
    receiver.behaviour = watching(watch, lambda song, n, attempt: (0.0, 200))
    tenant = await fifo_type(api, receiver, rate_limit=4, breaker_failures=0)
    now = datetime.now(UTC)
    await created(
        api,
        tenant,
        [body(tenant, song, n, now + timedelta(milliseconds=n)) for song in range(6) for n in range(2)],
    )
    await all_ended(api, tenant, 12, within=90)
    times = sorted(hit.at for hit in receiver.hits)
    assert len(times) == 12 and times[-1] - times[0] >= 1.8, times  # (12 - 4) / 4 s, less a margin
    assert max(watch.most.values()) == 1
    assert all(watch.arrivals[song] == [0, 1] for song in range(6))
