"""Every 201 carries ``Location`` (issue 25, item 3) and every route refuses a query parameter it does
not take with a 422 naming it (item 4), over a real server on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from starlette.routing import Route

from oste.api import api_routes
from oste.api.openapi import ACTIVITY_FILTERS, PAGING, TABLE
from tests.integration.api.conftest import Api, assert_problem, unique


def location(response: httpx.Response) -> str:
    assert response.status_code == 201, response.text
    assert "location" in response.headers, f"a 201 without Location: {response.request.url}"
    return response.headers["location"]


async def test_every_create_answering_201_names_what_it_created(api: Api) -> None:
    company = await api.post("/v1/companies", {"name": unique("co")})
    company_path = location(company)
    assert company_path == f"/v1/companies/{company.json()['name']}"
    assert (await api.get(company_path, expect=200)).json()["name"] == company.json()["name"]

    key = await api.post(f"{company_path}/api-keys", {"name": "backend"})
    assert location(key) == f"{company_path}/api-keys/{key.json()['id']}"

    solution = await api.post(f"{company_path}/solutions", {"name": unique("sol")})
    solution_path = location(solution)
    assert (await api.get(solution_path, expect=200)).json()["name"] == solution.json()["name"]

    body = {"name": unique("type"), "verb": "POST", "uri_pattern": "https://receiver.example/song/{SongId}"}
    activity_type = await api.post(f"{solution_path}/activity-types", body)
    assert (await api.get(location(activity_type), expect=200)).json()["name"] == body["name"]

    one = {"activity_type": body["name"], "parameter": {"SongId": 1}, "delay": "P1D"}
    activity = await api.post(f"{solution_path}/activities", one, headers={"Idempotency-Key": "k-1"})
    assert location(activity) == f"{solution_path}/activities/{activity.json()['id']}"
    assert (await api.get(location(activity), expect=200)).json()["id"] == activity.json()["id"]
    replay = await api.post(
        f"{solution_path}/activities", one, headers={"Idempotency-Key": "k-1"}, expect=200
    )
    assert "location" not in replay.headers  # nothing created: the one created before

    batch = await api.post(f"{solution_path}/activities", {"activities": [one, one]}, expect=201)
    assert "location" not in batch.headers  # many created: each is listed with its id
    assert len(batch.json()["activities"]) == 2

    schedule = {"activity_type": body["name"], "schedule": {"cron": "0 9 * * *"}, "parameter": {"SongId": 1}}
    recurring = await api.post(f"{solution_path}/recurring-activities", schedule)
    recurring_path = location(recurring)
    assert (await api.get(recurring_path, expect=200)).json()["id"] == recurring.json()["id"]

    ran = await api.post(f"{recurring_path}/run-now")
    assert (await api.get(location(ran), expect=200)).json()["id"] == ran.json()["id"]

    now = datetime.now(UTC)
    window = {"from": (now - timedelta(days=3)).isoformat(), "to": (now - timedelta(days=1)).isoformat()}
    backfill = await api.post(f"{recurring_path}/backfill", window)
    backfilled = {a["id"] for a in backfill.json()["created"]}
    assert len(backfilled) == 2
    listed = (await api.get(location(backfill), expect=200)).json()["items"]
    assert backfilled <= {a["id"] for a in listed}
    assert {a["recurring_activity"] for a in listed} == {recurring.json()["id"]}


async def test_a_typo_in_a_filter_is_refused_not_ignored(api: Api) -> None:
    tenant = await api.tenant()
    await api.post(tenant.activities, tenant.activity(1), expect=201)
    problem = assert_problem(await api.get(tenant.activities, params={"stat": "dead"}), 422, "stat")
    [error] = problem["errors"]
    assert error["reason"].startswith("is not a query parameter of this operation")
    assert all(name in error["reason"] for name in (*ACTIVITY_FILTERS, *PAGING)), error
    # the known ones still work
    assert (await api.get(tenant.activities, params={"state": "dead"}, expect=200)).json()["items"] == []


async def test_every_kind_of_route_refuses_an_unknown_query_parameter(api: Api) -> None:
    tenant = await api.tenant()
    company = f"/v1/companies/{tenant.company}"
    type_path = f"{tenant.types}/{tenant.activity_type}"
    activity = (await api.post(tenant.activities, tenant.activity(1, delay="P1D"), expect=201)).json()
    activity_path = f"{tenant.activities}/{activity['id']}"
    calls: list[tuple[str, str, Any]] = [
        ("GET", "/healthz", None),
        ("GET", "/v1/companies", None),
        ("GET", company, None),
        ("GET", activity_path, None),
        ("DELETE", type_path, None),
        ("DELETE", activity_path, None),
        ("POST", tenant.activities, tenant.activity(2)),
        ("PATCH", company, {"qos_level": 3}),
    ]
    for method, path, body in calls:
        response = await api.call(method, path, json=body, params={"limit": "5", "bogus": "1"})
        problem = assert_problem(response, 422, "bogus")
        if path != "/v1/companies":  # listings take limit; the others name it too
            assert {e["field"] for e in problem["errors"]} == {"bogus", "limit"}, (method, path, problem)
    # none of them did anything
    assert (await api.get(type_path, expect=200)).json()["name"] == tenant.activity_type
    assert (await api.get(activity_path, expect=200)).json()["state"] == "scheduled"
    assert [a["id"] for a in await api.all_items(tenant.activities)] == [activity["id"]]
    assert (await api.get(company, expect=200)).json()["qos_level"] == 1
    # a company key is refused the same way
    assert_problem(await api.get(tenant.activities, token=tenant.key, params={"stat": "x"}), 422, "stat")


def test_every_route_of_the_table_checks_its_query() -> None:
    operations = {(op.path, op.method) for ops in TABLE.values() for op in ops}
    routes = [r for r in api_routes() if isinstance(r, Route) and r.path != "/docs/static"]
    unchecked = [
        (route.path, sorted(route.methods or ()))
        for route in routes
        if any((route.path, m) in operations for m in route.methods or ())
        and not hasattr(route.endpoint, "__wrapped__")
    ]
    assert unchecked == []
