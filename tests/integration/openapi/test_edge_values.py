"""Values at the edges of what the spec allows answer a problem naming the field, never a 500.

Each case was a server error once (found by fuzzing the API on SQLite and PostgreSQL): times that
overflow when converted to UTC, non-ASCII digits, NUL characters (PostgreSQL stores none), nesting past
the JSON encoder's limit, and parameter schemas whose ``$ref`` points outside themselves (which also
made the server fetch the URL).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from oste.server import create_app
from oste.settings import Settings
from tests.conftest import migrated

TOKEN = "edge-admin-token"
SOLUTION = "/v1/companies/acme/solutions/shop"
PING = {"activity_type": "ping", "parameter": {"SongId": 7}}


@pytest.fixture
async def client(database_url: str, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The app on a fresh database (SQLite and PostgreSQL) with company acme, solution shop, type ping."""
    await migrated(database_url)  # a copy of the session's migrated template: migrating took seconds
    app = create_app(Settings(data_dir=tmp_path, database_url=database_url), TOKEN)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(app.router.lifespan_context(app))
        client = await stack.enter_async_context(
            httpx.AsyncClient(
                transport=transport, base_url="http://oste", headers={"Authorization": f"Bearer {TOKEN}"}
            )
        )
        for path, body in (
            ("/v1/companies", {"name": "acme"}),
            ("/v1/companies/acme/solutions", {"name": "shop"}),
            (
                SOLUTION + "/activity-types",
                {"name": "ping", "verb": "PUT", "uri_pattern": "https://h/{SongId}"},
            ),
        ):
            assert (await client.post(path, json=body)).status_code == 201
        yield client


def assert_problem(response: httpx.Response, status: int, field: str | None = None) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    if field is not None:
        assert field in [e["field"] for e in response.json()["errors"]], response.text


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("time", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
async def test_times_out_of_range_in_utc(client: httpx.AsyncClient, time: str) -> None:
    response = await client.post(SOLUTION + "/activities", json={**PING, "scheduled_for": time})
    assert_problem(response, 422, "scheduled_for")
    response = await client.get(SOLUTION + "/activities", params={"scheduled_after": time})
    assert_problem(response, 422, "scheduled_after")
    response = await client.post(
        "/v1/schedule-preview", json={"schedule": {"cron": "0 3 * * *"}, "after": time}
    )
    assert_problem(response, 422, "after")


async def test_limit_with_non_ascii_digits(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get("/v1/companies", params={"limit": "²"}), 422, "limit")


async def test_nul_characters_are_refused_with_their_field(client: httpx.AsyncClient) -> None:
    bad = {**PING, "parameter": {"SongId": "a\x00b", "ok": 1}}
    assert_problem(await client.post(SOLUTION + "/activities", json=bad), 422, "parameter/SongId")
    bad_key = {**PING, "parameter": {"SongId": 1, "k\x00": 1}}
    assert_problem(await client.post(SOLUTION + "/activities", json=bad_key), 422, "parameter/k\x00")
    batch = {"activities": [PING, {**PING, "parameter": {"SongId": "\x00"}}]}
    assert_problem(
        await client.post(SOLUTION + "/activities", json=batch), 422, "activities/1/parameter/SongId"
    )
    assert_problem(await client.post("/v1/companies/acme/api-keys", json={"name": "\x00"}), 422, "name")
    assert_problem(await client.get(SOLUTION + "/activities", params={"object_id": "\x00"}), 422, "object_id")
    nul_key = {"Idempotency-Key": "a\x00"}
    response = await client.post(SOLUTION + "/activities", json=PING, headers=nul_key)
    assert_problem(response, 422, "Idempotency-Key")
    listing = (await client.get(SOLUTION + "/activities")).json()
    assert listing["items"] == [], "nothing was stored"


async def test_names_in_the_path_that_are_no_slugs_are_not_found(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get("/v1/companies/a%00b"), 404)
    assert_problem(await client.get("/v1/companies/acme/solutions/%00"), 404)
    assert_problem(await client.get(SOLUTION + "/activity-types/A%00"), 404)


async def test_nesting_deeper_than_the_limit(client: httpx.AsyncClient) -> None:
    deep = {**PING, "parameter": {"SongId": 1, "x": nested(300)}}
    assert_problem(await client.post(SOLUTION + "/activities", json=deep), 422)
    fine = {**PING, "parameter": {"SongId": 1, "x": nested(50)}}
    response = await client.post(SOLUTION + "/activities", json=fine)
    assert response.status_code == 201, response.text
    assert response.json()["parameter"] == fine["parameter"]


@pytest.mark.parametrize("ref", ["http://169.254.169.254/latest/meta-data", "#/$defs/missing", "other.json"])
async def test_parameter_schema_references_must_stay_inside(client: httpx.AsyncClient, ref: str) -> None:
    body = {
        "name": "t",
        "verb": "PUT",
        "uri_pattern": "https://h/{SongId}",
        "parameter_schema": {"$ref": ref},
    }
    response = await client.post(SOLUTION + "/activity-types", json=body)
    assert_problem(response, 422, "parameter_schema/$ref")


async def test_local_parameter_schema_references_work(client: httpx.AsyncClient) -> None:
    schema = {
        "$defs": {"song": {"type": "integer", "minimum": 1}},
        "type": "object",
        "properties": {"SongId": {"$ref": "#/$defs/song"}},
    }
    body = {"name": "local", "verb": "PUT", "uri_pattern": "https://h/{SongId}", "parameter_schema": schema}
    assert (await client.post(SOLUTION + "/activity-types", json=body)).status_code == 201
    good = {"activity_type": "local", "parameter": {"SongId": 3}}
    assert (await client.post(SOLUTION + "/activities", json=good)).status_code == 201
    bad = {"activity_type": "local", "parameter": {"SongId": 0}}
    assert_problem(await client.post(SOLUTION + "/activities", json=bad), 422, "parameter/SongId")
