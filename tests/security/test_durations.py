"""A duration longer than OSTE can represent is a 422 naming its field, never a 500.

``P1000000000D`` (and ``PT99999999999999999999S``…) overflowed Python's ``timedelta`` inside the ISO 8601
parser: an uncaught ``OverflowError``, a 500 with two tracebacks in the log, for every duration field.

Refusals are sent with the admin token: ``rejected`` compares every row, and a company key's use
may update its ``last_used_at``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.api.conftest import Api, Tenant, assert_problem, rejected

HUGE = ["P1000000000D", "PT99999999999999999999S", "P99999999999W", "PT1" + "0" * 400 + "S"]


async def _activity_path(api: Api, tenant: Tenant) -> str:
    created = await api.post(tenant.activities, tenant.activity(delay="PT1H"), token=tenant.key, expect=201)
    return f"{tenant.activities}/{created.json()['id']}"


@pytest.mark.parametrize("duration", HUGE)
async def test_a_huge_delay_is_a_422_naming_it(api: Api, duration: str) -> None:
    tenant = await api.tenant()
    body = tenant.activity(delay=duration)
    problem = await rejected(api, "POST", tenant.activities, 422, "delay", json=body)
    assert "at most" in problem["detail"], problem
    batch = {"activities": [tenant.activity(), body]}
    field = "activities/1/delay"
    await rejected(api, "POST", tenant.activities, 422, field, json=batch)
    path = await _activity_path(api, tenant)
    await rejected(api, "PATCH", path, 422, "delay", json={"delay": duration})
    bulk = {"filter": {"state": "scheduled"}, "action": "update", "set": {"delay": duration}}
    bulk_path = f"{tenant.activities}/bulk"
    await rejected(api, "POST", bulk_path, 422, "set/delay", json=bulk)


async def test_a_huge_wait_is_a_422_naming_it(api: Api) -> None:
    tenant = await api.tenant()
    path = await _activity_path(api, tenant)
    for duration in HUGE:
        response = await api.get(path, params={"wait": duration}, token=tenant.key)
        assert_problem(response, 422, "wait")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("timeout", "P1000000000D"),
        ("backoff_base", "P99999999999W"),
        ("backoff_max", "P1000000000D"),
        ("on_success_delay", "PT99999999999999999999S"),
    ],
)
async def test_huge_type_durations_are_422s_naming_them(api: Api, field: str, value: str) -> None:
    tenant = await api.tenant()
    body: dict[str, Any] = {"name": "slow", "verb": "POST", "uri_pattern": "https://receiver.example/a"}
    if field == "on_success_delay":
        body["on_success"] = tenant.activity_type
    await rejected(api, "POST", tenant.types, 422, field, json={**body, field: value})
    patch = {field: value, **({"on_success": tenant.activity_type} if field == "on_success_delay" else {})}
    type_path = f"{tenant.types}/{tenant.activity_type}"
    await rejected(api, "PATCH", type_path, 422, field, json=patch)


@pytest.mark.parametrize("field", ["success_period", "dead_letter_period"])
async def test_huge_solution_periods_are_422s_naming_them(api: Api, field: str) -> None:
    tenant = await api.tenant()
    solutions = f"/v1/companies/{tenant.company}/solutions"
    body = {"name": "periodic", field: "P1000000000D"}
    await rejected(api, "POST", solutions, 422, field, json=body)
    await rejected(api, "PATCH", tenant.path, 422, field, json={field: "P1000000000D"})


@pytest.mark.parametrize("field", ["catchup_window", "spread", "max_jitter"])
async def test_huge_recurring_durations_are_422s_naming_them(api: Api, field: str) -> None:
    tenant = await api.tenant()
    body = {
        "activity_type": tenant.activity_type,
        "schedule": {"cron": "@daily"},
        "parameter": {"SongId": 1},
    }
    await rejected(api, "POST", tenant.recurring, 422, field, json={**body, field: "P1000000000D"})
    created = await api.post(tenant.recurring, body, expect=201)
    path = f"{tenant.recurring}/{created.json()['id']}"
    await rejected(api, "PATCH", path, 422, field, json={field: "PT99999999999999999999S"})


async def test_the_longest_representable_durations_still_meet_the_fields_bounds(api: Api) -> None:
    """Just inside what ``timedelta`` holds: the field's own maximum answers, as before."""
    tenant = await api.tenant()
    body = tenant.activity(delay="P999999999D")
    problem = assert_problem(await api.post(tenant.activities, body, token=tenant.key), 422, "delay")
    assert "at most" in problem["detail"], problem
