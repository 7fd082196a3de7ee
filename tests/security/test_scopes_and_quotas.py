"""A company key does what its scopes allow; a company holds what its quotas allow; a revoked key's UI
session ends. Each attack runs against a real server on both databases."""

from __future__ import annotations

import re
from typing import Any

import httpx

from tests.integration.api.conftest import Api, Tenant, assert_problem, dump

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


async def key_with(api: Api, tenant: Tenant, scopes: list[str], token: str | None = None) -> str:
    path = f"/v1/companies/{tenant.company}/api-keys"
    created = await api.post(path, {"name": "k", "scopes": scopes}, token=token or tenant.key, expect=201)
    assert created.json()["scopes"] == sorted(
        set(scopes) | ({"read"} if "write" in scopes else set()),
        key=[
            "read",
            "write",
            "keys",
        ].index,
    )
    return str(created.json()["key"])


async def test_a_read_key_reads_and_changes_nothing(api: Api) -> None:
    tenant = await api.tenant()
    reader = await key_with(api, tenant, ["read"])
    created = (await api.post(tenant.activities, tenant.activity(1, delay="PT1H"), expect=201)).json()
    await api.get(f"{tenant.activities}/{created['id']}", token=reader, expect=200)
    await api.get(tenant.activities, token=reader, expect=200)
    before = await dump(api)
    for method, path, body in [
        ("POST", tenant.activities, tenant.activity(2)),
        ("DELETE", f"{tenant.activities}/{created['id']}", None),
        ("PATCH", f"{tenant.types}/{tenant.activity_type}", {"paused": True}),
        ("POST", f"/v1/companies/{tenant.company}/api-keys", {"name": "more"}),
    ]:
        problem = assert_problem(await api.call(method, path, json=body, token=reader), 403)
        assert "scope" in problem["detail"], problem
    assert await dump(api) == before


async def test_a_key_cannot_grant_more_than_it_holds_and_keys_need_the_keys_scope(api: Api) -> None:
    tenant = await api.tenant()
    writer = await key_with(api, tenant, ["write"])  # minted by the tenant's first key (all scopes)
    keys_path = f"/v1/companies/{tenant.company}/api-keys"
    assert_problem(await api.post(keys_path, {"name": "x"}, token=writer), 403)
    keeper = await key_with(api, tenant, ["keys"])
    problem = assert_problem(await api.post(keys_path, {"name": "x", "scopes": ["write"]}, token=keeper), 403)
    assert "write" in problem["detail"]
    await key_with(api, tenant, ["keys"], token=keeper)
    assert_problem(
        await api.post(keys_path, {"name": "x", "scopes": ["admin"]}, token=keeper), 422, "scopes/0"
    )
    assert_problem(await api.get(tenant.activities, token=keeper), 403)


async def test_quotas_are_set_by_the_operator_and_shown_with_usage(api: Api) -> None:
    tenant = await api.tenant()
    company = f"/v1/companies/{tenant.company}"
    shown = (await api.get(company, expect=200)).json()
    assert shown["usage"] == {
        "scheduled_activities": 0,
        "activity_types": 1,
        "recurring_activities": 0,
        "solutions": 1,
        "api_keys": 1,
        "calendars": 0,
    }
    assert shown["quotas"]["max_activity_types"] == 1000  # the setting's default
    quotas = {"max_scheduled_activities": 2, "max_activity_types": 1, "max_recurring_activities": 0}
    patched = (await api.patch(company, {"quotas": quotas}, expect=200)).json()
    defaults = {"max_solutions": 100, "max_api_keys": 100, "max_calendars": 100, "requests_per_second": None}
    assert patched["quotas"] == {**quotas, **defaults}
    assert_problem(await api.patch(company, {"quotas": {"max_types": 3}}, token=None), 401)
    problem = assert_problem(await api.patch(company, {"quotas": {"max_types": 3}}), 422, "quotas")
    assert "max_types" in problem["detail"]
    assert_problem(await api.patch(company, {"quotas": {"max_activity_types": -1}}), 422)
    assert_problem(await api.patch(company, {"quotas": {"max_activity_types": 3}}, token=tenant.key), 403)


def quota_problem(response: httpx.Response, quota: str, limit: int, used: int) -> dict[str, Any]:
    problem = assert_problem(response, 429)
    assert (problem["quota"], problem["limit"], problem["used"]) == (quota, limit, used), problem
    return problem


async def test_a_create_over_a_quota_is_a_429_naming_it_and_stores_nothing(api: Api) -> None:
    tenant = await api.tenant()
    company = f"/v1/companies/{tenant.company}"
    quotas = {
        "max_scheduled_activities": 2,
        "max_activity_types": 1,
        "max_recurring_activities": 0,
        "max_solutions": 1,
        "max_api_keys": 2,
    }
    await api.patch(company, {"quotas": quotas}, expect=200)
    await key_with(api, tenant, ["read"])  # the second of two keys
    await api.post(tenant.activities, tenant.activity(1, delay="PT1H"), token=tenant.key, expect=201)
    before = await dump(api)
    batch = {"activities": [tenant.activity(i, delay="PT1H") for i in range(2)]}
    quota_problem(
        await api.post(tenant.activities, batch, token=tenant.key), "max_scheduled_activities", 2, 1
    )
    body = {"name": "second", "verb": "POST", "uri_pattern": "https://receiver.example/{SongId}"}
    quota_problem(await api.post(tenant.types, body, token=tenant.key), "max_activity_types", 1, 1)
    recurring = {
        "activity_type": tenant.activity_type,
        "schedule": {"cron": "0 3 * * *"},
        "parameter": {"SongId": 1},
    }
    quota_problem(
        await api.post(tenant.recurring, recurring, token=tenant.key), "max_recurring_activities", 0, 0
    )
    quota_problem(
        await api.post(f"{company}/solutions", {"name": "more"}, token=tenant.key), "max_solutions", 1, 1
    )
    keys = f"{company}/api-keys"
    quota_problem(await api.post(keys, {"name": "third"}, token=tenant.key), "max_api_keys", 2, 2)
    assert await dump(api) == before
    await api.post(tenant.activities, tenant.activity(2, delay="PT1H"), token=tenant.key, expect=201)
    other = await api.tenant()  # another company is not held back
    await api.post(
        other.activities, batch | {"activities": [other.activity(i) for i in range(3)]}, expect=201
    )


async def test_a_company_over_its_request_rate_waits_and_others_do_not(api: Api) -> None:
    tenant = await api.tenant()
    other = await api.tenant()
    company = f"/v1/companies/{tenant.company}"
    await api.patch(company, {"quotas": {"requests_per_second": 2}}, expect=200)
    answers = [await api.get(tenant.activities, token=tenant.key) for _ in range(6)]
    refused = [a for a in answers if a.status_code == 429]
    assert refused, [a.status_code for a in answers]
    assert int(refused[0].headers["retry-after"]) >= 1
    quota_problem(refused[0], "requests_per_second", 2, 2)
    await api.get(other.activities, token=other.key, expect=200)


async def test_revoking_a_key_ends_its_ui_session_at_once(api: Api) -> None:
    tenant = await api.tenant()
    key = await key_with(api, tenant, ["read", "write"])
    listed = (await api.get(f"/v1/companies/{tenant.company}/api-keys", expect=200)).json()["items"]
    key_id = next(k["id"] for k in listed if key.startswith(k["prefix"]))
    async with httpx.AsyncClient(base_url=str(api.http.base_url), timeout=30.0) as http:
        form = await http.get("/ui/sign-in")
        csrf = CSRF.search(form.text).group(1)  # type: ignore[union-attr]  # the form has one
        signed = await http.post("/ui/sign-in", data={"token": key, "csrf": csrf})
        assert signed.status_code == 303, signed.text
        assert (await http.get("/ui/")).status_code == 200
        await api.delete(f"/v1/companies/{tenant.company}/api-keys/{key_id}", expect=204)
        after = await http.get("/ui/")
        assert after.status_code == 303 and "/sign-in" in after.headers["location"]
    await api.get(tenant.activities, token=key, expect=401)


async def test_a_signed_out_visitor_writes_no_session(api: Api) -> None:
    from tests.integration.api.conftest import db_rows

    before = await db_rows(api.database_url, "SELECT count(*) AS n FROM ui_session")
    async with httpx.AsyncClient(base_url=str(api.http.base_url), timeout=30.0) as http:
        for _ in range(20):
            assert (await http.get("/ui/sign-in")).status_code == 200
        async with httpx.AsyncClient(base_url=str(api.http.base_url), timeout=30.0) as fresh:
            assert (await fresh.get("/ui/sign-in")).status_code == 200
    assert await db_rows(api.database_url, "SELECT count(*) AS n FROM ui_session") == before


async def test_revoking_a_key_closes_its_open_stream_and_long_poll(api: Api) -> None:
    import asyncio

    tenant = await api.tenant()
    key = await key_with(api, tenant, ["read"])
    listed = (await api.get(f"/v1/companies/{tenant.company}/api-keys", expect=200)).json()["items"]
    key_id = next(k["id"] for k in listed if key.startswith(k["prefix"]))
    created = (await api.post(tenant.activities, tenant.activity(1, delay="PT1H"), expect=201)).json()
    poll = asyncio.create_task(
        api.get(f"{tenant.activities}/{created['id']}", params={"wait": "PT60S"}, token=key)
    )
    lines: list[str] = []

    async def stream() -> None:
        headers = {"Authorization": f"Bearer {key}"}
        async with api.http.stream("GET", tenant.path + "/events", headers=headers) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                lines.append(line)

    reading = asyncio.create_task(stream())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while ": connected" not in lines:
        assert loop.time() < deadline and not reading.done(), lines
        await asyncio.sleep(0.01)
    await api.delete(f"/v1/companies/{tenant.company}/api-keys/{key_id}", expect=204)
    # both end within seconds, long before the long-poll's 60 s or a stream's end
    await asyncio.wait_for(reading, 10)
    assert any("revoked" in line for line in lines), lines
    answer = await asyncio.wait_for(poll, 10)
    assert_problem(answer, 401)


async def test_the_ui_shows_a_companys_quotas_and_usage(api: Api) -> None:
    from tests.integration.operations.test_one_path import Ui

    tenant = await api.tenant()
    await api.patch(f"/v1/companies/{tenant.company}", {"quotas": {"max_activity_types": 7}}, expect=200)
    async with httpx.AsyncClient(base_url=str(api.http.base_url), timeout=30.0) as http:
        ui = Ui(http)
        await ui.sign_in(tenant.key)
        page = (await http.get(f"/ui/companies/{tenant.company}")).text
    row = re.search(r"<td>max_activity_types</td><td>(\w+)</td><td>(\w+)</td>", page)
    assert row is not None and row.groups() == ("7", "1"), page


async def test_a_keys_last_use_is_kept_to_the_minute(api: Api) -> None:
    tenant = await api.tenant()
    keys = f"/v1/companies/{tenant.company}/api-keys"
    before = (await api.get(keys, expect=200)).json()["items"]
    assert [k["last_used_at"] for k in before] == [None]
    await api.get(tenant.activities, token=tenant.key, expect=200)
    used = (await api.get(keys, expect=200)).json()["items"][0]["last_used_at"]
    assert used is not None
    await api.get(tenant.activities, token=tenant.key, expect=200)
    assert (await api.get(keys, expect=200)).json()["items"][0]["last_used_at"] == used, "one write a minute"


async def test_a_key_reaching_another_company_gets_404_before_its_scopes_are_checked(api: Api) -> None:
    """Another company's paths answer 404 whatever the key's scopes: a 403 would say the company exists."""
    tenant, other = await api.tenant(), await api.tenant()
    writer = await key_with(api, tenant, ["write"])  # no `keys` scope
    for method, path in [
        ("GET", f"/v1/companies/{other.company}/api-keys"),
        ("POST", f"/v1/companies/{other.company}/api-keys"),
        ("GET", "/v1/companies/no-such-company/api-keys"),
    ]:
        body = {"name": "x"} if method == "POST" else None
        problem = assert_problem(await api.call(method, path, json=body, token=writer), 404)
        assert "not found" in problem["detail"], problem
    reader = await key_with(api, tenant, ["read"])
    assert_problem(await api.call("DELETE", f"{other.activities}/x", token=reader), 404)
    own = assert_problem(await api.get(f"/v1/companies/{tenant.company}/api-keys", token=writer), 403)
    assert "keys" in own["detail"]
