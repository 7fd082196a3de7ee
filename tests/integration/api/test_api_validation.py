"""Validation over a real server: each rejection is an RFC 9457 problem naming the field, changing nothing.

Pure validation does not depend on the database, so these run on SQLite only. Each table of cases runs
against one server, one subtest per case; after every rejected write the whole database must be as it
was before the request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from tests.integration.api.conftest import Api, Tenant, assert_problem, rejected

STRICT_SCHEMA = {
    "type": "object",
    "properties": {"SongId": {"type": "integer"}, "Album": {"type": "string"}},
    "required": ["SongId"],
}


@dataclass(frozen=True)
class World:
    """A tenant with a plain type (URI needs SongId) and a strict one (schema, Album in URI and object id)."""

    tenant: Tenant
    strict: str
    activity: str  # path of a scheduled activity of the plain type
    recurring: str  # path of a recurring activity of the plain type


@pytest.fixture
async def world(sqlite_api: Api) -> AsyncIterator[World]:
    tenant = await sqlite_api.tenant()
    strict = await sqlite_api.activity_type(
        tenant.path,
        uri_pattern="https://x.example/album/{Album}/song/{SongId}",
        parameter_schema=STRICT_SCHEMA,
        object_id_ref=["Album"],
    )
    activity = (await sqlite_api.post(tenant.activities, tenant.activity(), expect=201)).json()
    body = {"activity_type": tenant.activity_type, "schedule": {"cron": "@daily"}, "parameter": {"SongId": 1}}
    recurring = (await sqlite_api.post(tenant.recurring, body, expect=201)).json()
    yield World(
        tenant,
        strict["name"],
        f"{tenant.activities}/{activity['id']}",
        f"{tenant.recurring}/{recurring['id']}",
    )


# --- names, URI patterns, parameter schemas ---------------------------------------------------------

BAD_SLUGS = ["Acme", "-acme", "acme_co", "acme co", "acme.io", "", "a" * 64, "café", 5, None]


async def test_names_must_be_slugs(sqlite_api: Api, world: World, subtests: Any) -> None:
    type_fields = {"verb": "POST", "uri_pattern": "https://x.example/"}
    collections = {
        "/v1/companies": {},
        f"/v1/companies/{world.tenant.company}/solutions": {},
        world.tenant.types: type_fields,
    }
    for path, extra in collections.items():
        for name in BAD_SLUGS:
            with subtests.test(path=path, name=name):
                problem = await rejected(sqlite_api, "POST", path, 422, "name", json={"name": name, **extra})
                assert "slug" in problem["detail"] or name is None or not isinstance(name, str)


BAD_URI_PATTERNS = {
    "ftp://x.example/song/{SongId}": "not http(s)",
    "/song/{SongId}": "relative",
    "x.example/song/{SongId}": "no scheme",
    "https:///song/{SongId}": "no host",
    "https://x.example/song/{SongId": "unbalanced {",
    "https://x.example/song/SongId}": "unbalanced }",
    "https://x.example/song/{{SongId}}": "nested braces",
    "https://x.example/song/{}": "empty placeholder",
    "https://x.example/song/{Song Id}": "space in placeholder",
    "https://{Host}/song": "placeholder in host",
    "https://x.example:{Port}/song": "placeholder in port",
    "https://x.example/a b": "whitespace",
    "": "empty",
}


async def test_uri_pattern_must_be_absolute_http_with_well_formed_placeholders(
    sqlite_api: Api, world: World, subtests: Any
) -> None:
    type_path = f"{world.tenant.types}/{world.tenant.activity_type}"
    for pattern, why in BAD_URI_PATTERNS.items():
        with subtests.test(why, pattern=pattern):
            body = {"name": "new-type", "verb": "POST", "uri_pattern": pattern}
            await rejected(sqlite_api, "POST", world.tenant.types, 422, "uri_pattern", json=body)
            await rejected(sqlite_api, "PATCH", type_path, 422, "uri_pattern", json={"uri_pattern": pattern})
    with subtests.test("placeholder in success_uri"):
        body = {"name": "s", "success_uri": "https://x.example/{Id}"}
        path = f"/v1/companies/{world.tenant.company}/solutions"
        await rejected(sqlite_api, "POST", path, 422, "success_uri", json=body)


BAD_SCHEMAS = [
    {"type": "nonsense"},
    {"properties": {"SongId": {"type": 5}}},
    {"required": "SongId"},
    {"minimum": "zero"},
    {"additionalProperties": "no"},
    [],
    "object",
]


async def test_parameter_schema_must_be_a_valid_json_schema(
    sqlite_api: Api, world: World, subtests: Any
) -> None:
    type_path = f"{world.tenant.types}/{world.tenant.activity_type}"
    for schema in BAD_SCHEMAS:
        with subtests.test(schema=schema):
            body = {
                "name": "t",
                "verb": "POST",
                "uri_pattern": "https://x.example/",
                "parameter_schema": schema,
            }
            for method, path, sent in (
                ("POST", world.tenant.types, body),
                ("PATCH", type_path, {"parameter_schema": schema}),
            ):
                problem = await rejected(sqlite_api, method, path, 422, json=sent)
                fields = [e["field"] for e in problem["errors"]]
                assert any(f.startswith("parameter_schema") for f in fields), problem


async def test_object_id_ref_must_be_a_field_the_schema_allows(sqlite_api: Api, world: World) -> None:
    schema = {"type": "object", "properties": {"SongId": {}}, "additionalProperties": False}
    body = {
        "name": "t",
        "verb": "POST",
        "uri_pattern": "https://x.example/",
        "parameter_schema": schema,
        "object_id_ref": ["Album"],
    }
    await rejected(sqlite_api, "POST", world.tenant.types, 422, "object_id_ref", json=body)


BAD_HEADERS = [
    ({"Host": "evil.example"}, "headers/Host"),
    ({"Idempotency-Key": "x"}, "headers/Idempotency-Key"),
    ({"OSTE-Attempt": "9"}, "headers/OSTE-Attempt"),
    ({"Bad Name": "v"}, "headers/Bad Name"),
    ({"X-Split": "a\r\nInjected: yes"}, "headers/X-Split"),
    ({"X-Token": {"secret": True}}, "headers/X-Token"),
    ({"X-Token": 5}, "headers/X-Token"),
]


async def test_static_headers_are_checked(sqlite_api: Api, world: World, subtests: Any) -> None:
    for headers, field in BAD_HEADERS:
        with subtests.test(field=field):
            body = {"name": "t", "verb": "POST", "uri_pattern": "https://x.example/", "headers": headers}
            await rejected(sqlite_api, "POST", world.tenant.types, 422, field, json=body)


# --- parameters ---------------------------------------------------------------------------------------

# (use the strict type?, parameter, field named)
BAD_PARAMETERS = [
    (True, {"SongId": "abc", "Album": "a"}, "parameter/SongId"),  # violates the schema
    (True, {"Album": "a"}, "parameter/SongId"),  # required by the schema and the URI
    (True, {"SongId": 1}, "parameter/Album"),  # fills {Album}; object_id_ref
    (True, {"SongId": 1, "Album": None}, "parameter/Album"),  # object id field null
    (False, {}, "parameter/SongId"),  # a placeholder's field is missing
    (False, {"SongId": {"id": 1}}, "parameter/SongId"),  # a placeholder needs a scalar
    (False, {"SongId": [1]}, "parameter/SongId"),
    (False, [1, 2], "parameter"),
    (False, "SongId=1", "parameter"),
]


async def test_parameters_are_checked_everywhere_they_are_accepted(
    sqlite_api: Api, world: World, subtests: Any
) -> None:
    t = world.tenant
    for strict, parameter, field in BAD_PARAMETERS:
        activity_type = world.strict if strict else t.activity_type
        with subtests.test(activity_type=activity_type, parameter=parameter):
            body = {"activity_type": activity_type, "parameter": parameter}
            await rejected(sqlite_api, "POST", t.activities, 422, field, json=body)
            batch = {"activities": [t.activity(), body]}
            await rejected(sqlite_api, "POST", t.activities, 422, f"activities/1/{field}", json=batch)
            recurring = {**body, "schedule": {"cron": "@daily"}}
            await rejected(sqlite_api, "POST", t.recurring, 422, field, json=recurring)
            if not strict:
                await rejected(sqlite_api, "PATCH", world.activity, 422, field, json={"parameter": parameter})
                await rejected(
                    sqlite_api, "PATCH", world.recurring, 422, field, json={"parameter": parameter}
                )


async def test_activity_fields_are_checked(sqlite_api: Api, world: World, subtests: Any) -> None:
    t = world.tenant
    cases = [
        ({"activity_type": "no-such-type", "parameter": {"SongId": 1}}, "activity_type"),
        ({"activity_type": "Not A Slug", "parameter": {"SongId": 1}}, "activity_type"),
        ({"parameter": {"SongId": 1}}, ""),  # activity_type is required
        (t.activity(priority=5000), "priority"),
        (t.activity(retries=-1), "retries"),
        (t.activity(scheduled_for="tomorrow"), "scheduled_for"),
        (t.activity(scheduled_for="2030-01-01T00:00:00"), "scheduled_for"),  # no offset
        (t.activity(colour="red"), ""),
    ]
    for body, field in cases:
        with subtests.test(body=body):
            await rejected(sqlite_api, "POST", t.activities, 422, field, json=body)
    with subtests.test("batch shape"):
        for batch, field in (({"activities": []}, "activities"), ({"activities": "x"}, "activities")):
            await rejected(sqlite_api, "POST", t.activities, 422, field, json=batch)
    with subtests.test("Idempotency-Key too long"):
        headers = {"Idempotency-Key": "k" * 256}
        await rejected(
            sqlite_api, "POST", t.activities, 422, "Idempotency-Key", json=t.activity(), headers=headers
        )


# --- schedules ----------------------------------------------------------------------------------------

BAD_SCHEDULES = [
    ({"minute": "61"}, "schedule/minute"),
    ({"hour": "24"}, "schedule/hour"),
    ({"second": "60"}, "schedule/second"),
    ({"day": "32"}, "schedule/day"),
    ({"month": "13"}, "schedule/month"),
    ({"week": "54"}, "schedule/week"),
    ({"year": "soon"}, "schedule/year"),
    ({"day_of_week": "8"}, "schedule/day_of_week"),
    ({"day_of_week": "6-1"}, "schedule/day_of_week"),
    ({"day_of_week": "funday"}, "schedule/day_of_week"),
    ({"minute": ""}, "schedule/minute"),
    ({"cron": "* * *"}, "schedule/cron"),
    ({"cron": "* * * * * * *"}, "schedule/cron"),
    ({"cron": "61 * * * *"}, "schedule/cron"),
    ({"cron": "0 25 * * *"}, "schedule/cron"),
    ({"cron": "0 0 * * 8"}, "schedule/cron"),
    ({"cron": "@sometimes"}, "schedule/cron"),
    ({"cron": "0 * * * *", "minute": "5"}, "schedule"),
    ({}, "schedule"),
    ({"fortnight": "1"}, "schedule"),
]
BAD_ZONES = ["Mars/Olympus", "Europe/Londn", "+01:00", "", "utc/../etc"]


async def test_schedules_are_checked(sqlite_api: Api, world: World, subtests: Any) -> None:
    t = world.tenant
    for schedule, field in BAD_SCHEDULES:
        with subtests.test(schedule=schedule):
            body = {"activity_type": t.activity_type, "parameter": {"SongId": 1}, "schedule": schedule}
            await rejected(sqlite_api, "POST", t.recurring, 422, field, json=body)
            await rejected(sqlite_api, "PATCH", world.recurring, 422, field, json={"schedule": schedule})
            await rejected(
                sqlite_api, "POST", "/v1/schedule-preview", 422, field, json={"schedule": schedule}
            )


async def test_time_zones_and_bounds_are_checked(sqlite_api: Api, world: World, subtests: Any) -> None:
    t = world.tenant
    base = {"activity_type": t.activity_type, "parameter": {"SongId": 1}, "schedule": {"cron": "@daily"}}
    for zone in BAD_ZONES:
        with subtests.test(zone=zone):
            await rejected(sqlite_api, "POST", t.recurring, 422, "timezone", json={**base, "timezone": zone})
            await rejected(sqlite_api, "PATCH", world.recurring, 422, "timezone", json={"timezone": zone})
            preview = {"schedule": {"cron": "@daily"}, "timezone": zone}
            await rejected(sqlite_api, "POST", "/v1/schedule-preview", 422, "timezone", json=preview)
    bounds = [
        ({"start_at": "tomorrow"}, "start_at"),
        ({"end_at": "2030-01-01"}, "end_at"),
        ({"start_at": "2030-01-02T00:00:00Z", "end_at": "2030-01-01T00:00:00Z"}, "end_at"),
    ]
    for extra, field in bounds:
        with subtests.test(bounds=extra):
            await rejected(sqlite_api, "POST", t.recurring, 422, field, json={**base, **extra})
    with subtests.test("preview count"):
        preview = {"schedule": {"cron": "@daily"}, "count": 101}
        await rejected(sqlite_api, "POST", "/v1/schedule-preview", 422, "count", json=preview)


# --- durations and numbers ------------------------------------------------------------------------------

BAD_DURATIONS = ["7 days", "30s", "P1M", "P1Y", "P", "PT", "-PT5M", "PT5X", 30, None]


async def test_durations_are_iso_8601(sqlite_api: Api, world: World, subtests: Any) -> None:
    t = world.tenant
    solutions = f"/v1/companies/{t.company}/solutions"
    type_path = f"{t.types}/{t.activity_type}"
    for value in BAD_DURATIONS:
        with subtests.test(value=value):
            for field in ("success_period", "dead_letter_period"):
                await rejected(sqlite_api, "POST", solutions, 422, field, json={"name": "s", field: value})
                await rejected(sqlite_api, "PATCH", t.path, 422, field, json={field: value})
            for field in ("timeout", "backoff_base", "backoff_max"):
                await rejected(sqlite_api, "PATCH", type_path, 422, field, json={field: value})
            await rejected(sqlite_api, "POST", t.activities, 422, "delay", json=t.activity(delay=value))
            await rejected(sqlite_api, "PATCH", world.activity, 422, "delay", json={"delay": value})
    for value, why in (("PT0S", "zero"), ("PT16M", "over 15 minutes")):
        with subtests.test(f"timeout {why}"):
            await rejected(sqlite_api, "PATCH", type_path, 422, "timeout", json={"timeout": value})


async def test_numbers_are_in_range(sqlite_api: Api, world: World, subtests: Any) -> None:
    t = world.tenant
    type_path = f"{t.types}/{t.activity_type}"
    cases = [
        ("PATCH", f"/v1/companies/{t.company}", {"qos_level": 0}, "qos_level"),
        ("PATCH", f"/v1/companies/{t.company}", {"qos_level": "2"}, "qos_level"),
        ("PATCH", f"/v1/companies/{t.company}", {"paused": "yes"}, "paused"),
        ("PATCH", t.path, {"qos_level": 1001}, "qos_level"),
        ("PATCH", type_path, {"retries": -1}, "retries"),
        ("PATCH", type_path, {"verb": "FETCH"}, "verb"),
        ("PATCH", type_path, {"max_concurrency": 0}, "max_concurrency"),
        ("PATCH", type_path, {"rate_limit": 0}, "rate_limit"),
        ("PATCH", world.activity, {"priority": 1001}, "priority"),
        ("PATCH", world.recurring, {"priority": -1001}, "priority"),
    ]
    for method, path, body, field in cases:
        with subtests.test(path=path, body=body):
            await rejected(sqlite_api, method, path, 422, field, json=body)


# --- paging -----------------------------------------------------------------------------------------------


async def test_limit_and_cursor_are_checked(sqlite_api: Api, world: World, subtests: Any) -> None:
    t = world.tenant
    listings = [
        "/v1/companies",
        f"/v1/companies/{t.company}/api-keys",
        f"/v1/companies/{t.company}/solutions",
        t.types,
        t.activities,
        f"{world.activity}/executions",
        t.recurring,
    ]
    for path in listings:
        for limit in ("0", "1001", "abc", "-1", "1.5", ""):
            with subtests.test(path=path, limit=limit):
                problem = assert_problem(await sqlite_api.get(path, params={"limit": limit}), 422, "limit")
                assert "1000" in problem["detail"]
        with subtests.test(path=path, cursor="garbage"):
            assert_problem(await sqlite_api.get(path, params={"cursor": "garbage!"}), 422, "cursor")
    with subtests.test("cascade flag"):
        assert_problem(await sqlite_api.delete(t.path, params={"cascade": "maybe"}), 422, "cascade")


# --- HTTP-level problems ------------------------------------------------------------------------------


async def test_malformed_json_is_400(sqlite_api: Api, subtests: Any) -> None:
    for raw in (b'{"name": ', b"not json", b'{"name": "a",}', b"", b"   ", b"\xff\xfe"):
        with subtests.test(raw=raw):
            headers = {"Content-Type": "application/json"}
            await rejected(sqlite_api, "POST", "/v1/companies", 400, content=raw, headers=headers)


async def test_body_must_be_a_json_object(sqlite_api: Api, subtests: Any) -> None:
    for body in ([], "acme", 5, None, {"name": "acme", "colour": "red"}):
        with subtests.test(body=body):
            raw = orjson.dumps(body)
            headers = {"Content-Type": "application/json"}
            problem = await rejected(sqlite_api, "POST", "/v1/companies", 422, content=raw, headers=headers)
            if isinstance(body, dict):
                assert "colour" in problem["detail"]


async def test_wrong_content_type_is_415(sqlite_api: Api, world: World, subtests: Any) -> None:
    cases = {
        "text/plain": b'{"name": "acme"}',
        "application/x-www-form-urlencoded": b"name=acme",
        "multipart/form-data; boundary=x": b"--x--",
        "": b'{"name": "acme"}',
    }
    for content_type, raw in cases.items():
        with subtests.test(content_type=content_type):
            headers = {"Content-Type": content_type} if content_type else {}
            await rejected(sqlite_api, "POST", "/v1/companies", 415, content=raw, headers=headers)
            activity = b'{"activity_type": "x"}'
            await rejected(
                sqlite_api, "POST", world.tenant.activities, 415, content=activity, headers=headers
            )
    with subtests.test("+json suffix is JSON"):
        headers = {"Content-Type": "application/merge-patch+json"}
        await sqlite_api.call(
            "PATCH", world.activity, content=b'{"priority": 2}', headers=headers, expect=200
        )


async def test_oversized_body_is_413(server_with: Any, subtests: Any) -> None:
    async with server_with(max_body_bytes=2048) as api:
        big = {"name": "acme", "pad": "x" * 4096}
        with subtests.test("declared length"):
            problem = await rejected(api, "POST", "/v1/companies", 413, json=big)
            assert "2048" in problem["detail"]

        async def chunks() -> AsyncIterator[bytes]:
            yield b'{"name": "acme", "pad": "'
            for _ in range(8):
                yield b"x" * 512
            yield b'"}'

        with subtests.test("chunked, no declared length"):
            headers = {"Content-Type": "application/json"}
            await rejected(api, "POST", "/v1/companies", 413, content=chunks(), headers=headers)
        with subtests.test("a body within the limit passes"):
            await api.post("/v1/companies", {"name": "acme"}, expect=201)


async def test_unknown_route_is_404(sqlite_api: Api, world: World, subtests: Any) -> None:
    paths = ["/nope", "/v1", "/v1/activities", f"{world.tenant.path}/unknown", "/v1/companies/a/b/c/d/e/f"]
    for path in paths:
        for token in (sqlite_api.admin_token, None):
            with subtests.test(path=path, token=bool(token)):
                response = await sqlite_api.get(path, token=token)
                assert_problem(response, 404)
                assert "<html" not in response.text.lower()


async def test_wrong_method_is_405(sqlite_api: Api, world: World, subtests: Any) -> None:
    t = world.tenant
    cases = [
        ("PUT", "/v1/companies", {"GET", "POST"}),
        ("DELETE", "/v1/companies", {"GET", "POST"}),
        ("POST", f"/v1/companies/{t.company}", {"GET", "PATCH", "DELETE"}),
        ("PUT", t.path, {"GET", "PATCH", "DELETE"}),
        ("PATCH", t.activities, {"GET", "POST"}),
        ("GET", "/v1/schedule-preview", {"POST"}),
        ("GET", f"{world.recurring}/pause", {"POST"}),
        ("POST", "/healthz", {"GET"}),
    ]
    for method, path, allowed in cases:
        with subtests.test(method=method, path=path):
            response = await sqlite_api.call(method, path, json={})
            assert_problem(response, 405)
            assert allowed <= {m.strip() for m in response.headers["allow"].split(",")}


async def test_a_schedule_that_never_fires_is_a_422_at_create_patch_and_preview(api: Api) -> None:
    tenant = await api.tenant()
    never = {"cron": "0 0 31 4,6,9,11 *"}  # 31 April, June, September, November
    body = {"activity_type": tenant.activity_type, "schedule": never, "parameter": {"SongId": 1}}
    problem = await rejected(api, "POST", tenant.recurring, 422, "schedule/cron", json=body)
    assert "never fires" in problem["detail"]
    created = (
        await api.post(tenant.recurring, {**body, "schedule": {"cron": "0 3 * * *"}}, expect=201)
    ).json()
    path = f"{tenant.recurring}/{created['id']}"
    await rejected(api, "PATCH", path, 422, "schedule/cron", json={"schedule": never})
    await rejected(api, "POST", "/v1/schedule-preview", 422, "schedule/cron", json={"schedule": never})
    await api.patch(path, {"priority": 3}, expect=200)  # what is stored is not checked again
