"""The destinations API: the operator sees and steers every destination's breaker and cap; a company
key sees only the destinations its own activities were sent to, and can change none."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import pytest
from aiohttp import web

from oste.settings import Settings
from tests.engine_support import Receiver
from tests.integration.api.conftest import Api, Tenant, api_client, assert_problem

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def engine_api(database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    settings = Settings(
        data_dir=tmp_path,
        database_url=database_url,
        allowed_targets=("127.0.0.1",),
        destination_max_in_flight=50,
    )
    async with api_client(settings, run_engine=True) as client:
        yield client


async def used(api: Api, tenant: Tenant, destination: str) -> dict[str, object]:
    """Fire one activity of ``tenant`` and wait until its company lists ``destination``."""
    await api.post(tenant.activities, tenant.activity(1), token=tenant.key, expect=201)
    company = tenant.path.split("/solutions/")[0]
    deadline = asyncio.get_running_loop().time() + 20
    while True:
        items = (await api.get(company + "/destinations", token=tenant.key, expect=200)).json()["items"]
        found = [item for item in items if item["destination"] == destination]
        if found:
            return found[0]
        assert asyncio.get_running_loop().time() < deadline, f"{destination} never listed: {items}"
        await asyncio.sleep(0.05)


async def test_a_company_sees_only_its_own_destinations_and_the_operator_steers_them(
    engine_api: Api, receiver: Receiver
) -> None:
    api = engine_api
    mine = await api.tenant(uri_pattern=receiver.url + "/song/{SongId}")
    other = await api.tenant(uri_pattern="http://127.0.0.2:9/song/{SongId}")
    destination = f"http://127.0.0.1:{receiver.port}"
    listed = await used(api, mine, destination)
    listed.pop("last_hour")  # its own test below
    assert listed == {
        "destination": destination,
        "state": "closed",
        "failures": 0,
        "opened_at": None,
        "next_probe_at": None,
        "forced": False,
        "max_in_flight": 50,
        "own_max_in_flight": None,
        "scope": "company",
        "opened_by": None,
    }
    other_company = other.path.split("/solutions/")[0]
    theirs = (await api.get(other_company + "/destinations", token=other.key, expect=200)).json()["items"]
    assert all(item["destination"] != destination for item in theirs)  # never another company's hosts
    every = (await api.get("/v1/destinations", expect=200)).json()["items"]
    assert destination in [item["destination"] for item in every]

    # Only the operator reads them all or changes one.
    assert_problem(await api.get("/v1/destinations", token=mine.key), 403)
    assert_problem(await api.post(f"/v1/destinations/{destination}/open", token=mine.key), 403)
    assert_problem(
        await api.patch(f"/v1/destinations/{destination}", {"max_in_flight": 2}, token=mine.key), 403
    )

    opened = (await api.post(f"/v1/destinations/{destination}/open", expect=200)).json()
    assert opened["state"] == "open" and opened["forced"] and opened["next_probe_at"] is None
    assert (opened["scope"], opened["opened_by"], opened["companies"]) == ("destination", "operator", [])
    encoded = quote(destination, safe="")
    assert (await api.get(f"/v1/destinations/{encoded}", expect=200)).json()["state"] == "open"
    capped = (await api.patch(f"/v1/destinations/{destination}", {"max_in_flight": 2}, expect=200)).json()
    assert capped["max_in_flight"] == 2 and capped["own_max_in_flight"] == 2
    closed = (await api.post(f"/v1/destinations/{destination}/close", expect=200)).json()
    assert closed["state"] == "closed" and not closed["forced"] and closed["failures"] == 0
    reset = (await api.patch(f"/v1/destinations/{destination}", {"max_in_flight": None}, expect=200)).json()
    assert reset["max_in_flight"] == 50 and reset["own_max_in_flight"] is None


async def test_bad_destinations_and_caps_are_refused_naming_the_field(engine_api: Api) -> None:
    api = engine_api
    assert_problem(await api.post("/v1/destinations/ftp://files.example.com/open"), 422, "destination")
    assert_problem(await api.get("/v1/destinations/not-a-uri"), 422, "destination")
    assert_problem(await api.get("/v1/destinations/https://never.example.com:443"), 404)
    too_big = {"max_in_flight": 10**9}
    assert_problem(
        await api.patch("/v1/destinations/https://a.example.com:443", too_big), 422, "max_in_flight"
    )
    missing = assert_problem(await api.patch("/v1/destinations/https://a.example.com:443", {}), 422)
    assert "max_in_flight" in missing["detail"]
    assert_problem(await api.get("/v1/destinations?state=open"), 422, "state")


async def _failing_songs(request: web.Request, receiver: Receiver) -> web.StreamResponse:
    """Songs with an odd id fail with a 500 (after 30 ms); even ones succeed."""
    await asyncio.sleep(0.03)
    return web.Response(status=500 if int(request.path.rsplit("/", 1)[1]) % 2 else 200)


async def last_hour(
    api: Api, path: str, destination: str, token: str | None, attempts: int
) -> dict[str, object]:
    """The destination's ``last_hour`` once it counts ``attempts`` (rollups are written every second)."""
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        answer = await (
            api.get(path, expect=200) if token is None else api.get(path, token=token, expect=200)
        )
        items = answer.json()["items"]
        found = [i["last_hour"] for i in items if i["destination"] == destination and i["last_hour"]]
        if found and found[0]["attempts"] >= attempts:
            return found[0]
        assert asyncio.get_running_loop().time() < deadline, (
            f"{destination} never counted {attempts}: {items}"
        )
        await asyncio.sleep(0.1)


async def test_a_destinations_last_hour_counts_requests_failures_and_latency_per_company(
    engine_api: Api,
) -> None:
    """Issue 39 (O11): each destination shows its last hour's requests, error rate and latency; a company
    sees its own requests only, the operator every company's."""
    receiver = await Receiver(behaviour=_failing_songs).start()
    try:
        api = engine_api
        pattern = receiver.url + "/song/{SongId}"
        a = await api.tenant(uri_pattern=pattern, retries=0)
        b = await api.tenant(uri_pattern=pattern, retries=0)
        for song in (1, 2, 3, 4):  # two fail
            await api.post(a.activities, a.activity(song), token=a.key, expect=201)
        for song in (2, 4):
            await api.post(b.activities, b.activity(song), token=b.key, expect=201)
        destination = f"http://127.0.0.1:{receiver.port}"
        await receiver.wait_for(6, within=30)

        mine = await last_hour(api, a.path.split("/solutions/")[0] + "/destinations", destination, a.key, 4)
        assert (mine["attempts"], mine["failed"], mine["error_rate"]) == (4, 2, 0.5), mine
        latency = mine["latency"]
        assert 0.03 <= latency["p50"] <= latency["p95"] <= latency["max"] < 30, latency
        theirs = await last_hour(api, b.path.split("/solutions/")[0] + "/destinations", destination, b.key, 2)
        assert (theirs["attempts"], theirs["failed"], theirs["error_rate"]) == (2, 0, 0.0), theirs
        every = await last_hour(api, "/v1/destinations", destination, None, 6)
        assert (every["attempts"], every["failed"]) == (6, 2), every
        one = (await api.get(f"/v1/destinations/{quote(destination, safe='')}", expect=200)).json()
        assert one["last_hour"] == every, one
    finally:
        await receiver.stop()
