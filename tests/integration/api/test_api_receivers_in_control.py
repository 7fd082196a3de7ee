"""A type's status policy, ``max_snoozes`` and ``max_lateness``, and an activity's ``expires_at``, over a
real server on SQLite and PostgreSQL: stored, shown, patched, and refused (422 naming the field) when
they cannot mean anything."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.integration.api.conftest import Api, rejected


async def test_the_status_policy_is_stored_patched_and_shown(api: Api) -> None:
    tenant = await api.tenant()
    path = f"{tenant.types}/{tenant.activity_type}"
    activity_type = (await api.get(path, expect=200)).json()
    assert (activity_type["retry_statuses"], activity_type["fail_statuses"]) == (None, None)
    assert (activity_type["max_snoozes"], activity_type["max_lateness"]) == (50, None)
    changes = {
        "retry_statuses": ["5xx", 429],
        "fail_statuses": [503],
        "max_snoozes": 3,
        "max_lateness": "PT2H",
    }
    patched = (await api.patch(path, changes, expect=200)).json()
    assert patched["retry_statuses"] == ["5xx", 429] and patched["fail_statuses"] == [503]
    assert (patched["max_snoozes"], patched["max_lateness"]) == (3, "PT2H")
    assert (await api.get(path, expect=200)).json() == patched
    cleared = (await api.patch(path, {"fail_statuses": None, "max_lateness": None}, expect=200)).json()
    assert cleared["fail_statuses"] is None and cleared["max_lateness"] is None
    assert cleared["retry_statuses"] == ["5xx", 429]


async def test_a_status_in_both_lists_is_refused_naming_the_field(api: Api) -> None:
    tenant = await api.tenant(retry_statuses=["5xx"])
    path = f"{tenant.types}/{tenant.activity_type}"
    problem = await rejected(api, "PATCH", path, 422, "fail_statuses", json={"fail_statuses": ["5xx"]})
    assert "retry_statuses" in problem["detail"]
    body = {
        "name": "both",
        "verb": "POST",
        "uri_pattern": "https://receiver.example/x",
        "retry_statuses": [404],
    }
    await rejected(api, "POST", tenant.types, 422, "fail_statuses", json={**body, "fail_statuses": [404]})
    for bad in ([99], [600], ["6xx"], ["5XX0"], [True]):
        await rejected(api, "PATCH", path, 422, json={"retry_statuses": bad})
    await rejected(api, "PATCH", path, 422, "max_lateness", json={"max_lateness": "PT0S"})
    await rejected(api, "PATCH", path, 422, "max_snoozes", json={"max_snoozes": -1})


async def test_expires_at_must_be_after_scheduled_for(api: Api) -> None:
    tenant = await api.tenant()
    now = datetime.now(UTC)
    at = (now + timedelta(hours=1)).isoformat()
    body = tenant.activity(scheduled_for=at, expires_at=(now + timedelta(hours=2)).isoformat())
    created = (await api.post(tenant.activities, body, expect=201)).json()
    assert created["expires_at"] is not None and created["snoozes"] == 0
    assert datetime.fromisoformat(created["expires_at"]) == datetime.fromisoformat(body["expires_at"])
    too_soon = tenant.activity(scheduled_for=at, expires_at=at)
    await rejected(api, "POST", tenant.activities, 422, "expires_at", json=too_soon)
    item = f"{tenant.activities}/{created['id']}"
    later = (now + timedelta(hours=3)).isoformat()
    await rejected(api, "PATCH", item, 422, "scheduled_for", json={"scheduled_for": later})
    patched = (await api.patch(item, {"expires_at": None}, expect=200)).json()
    assert patched["expires_at"] is None
    plain = (await api.post(tenant.activities, tenant.activity(), expect=201)).json()
    assert plain["expires_at"] is None
