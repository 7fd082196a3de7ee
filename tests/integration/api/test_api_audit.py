"""The audit: who changed what, and when, read back per solution and per company (SQLite and PostgreSQL)."""

from __future__ import annotations

from typing import Any

from tests.integration.api.conftest import Api, assert_problem


async def entries(api: Api, path: str, token: Any = ..., **params: Any) -> list[dict[str, Any]]:
    return await api.all_items(path + "/audit", limit=2, params=params, token=token)


async def test_changes_are_recorded_with_who_made_them_newest_first(api: Api) -> None:
    company = await api.company()
    key = (
        await api.post(f"/v1/companies/{company['name']}/api-keys", {"name": "partner"}, expect=201)
    ).json()
    solution = await api.solution(company["name"], token=key["key"])
    path = f"/v1/companies/{company['name']}/solutions/{solution['name']}"
    activity_type = await api.activity_type(path, object_id_ref=["SongId"])
    activities = path + "/activities"
    one = {"activity_type": activity_type["name"], "parameter": {"SongId": 1}, "delay": "PT1H"}
    single = (await api.post(activities, one, token=key["key"], expect=201)).json()
    await api.post(activities, {"activities": [one, one, one]}, expect=201)
    await api.patch(f"{activities}/{single['id']}", {"priority": 5}, token=key["key"], expect=200)
    await api.post(f"{activities}/{single['id']}/run-now", token=key["key"], expect=202)
    bulk = {"filter": {"object_id": "1"}, "action": "cancel"}
    await api.post(activities + "/bulk", {**bulk, "dry_run": True}, expect=200)  # not recorded
    await api.post(activities + "/bulk", bulk, token=key["key"], expect=200)

    rows = await entries(api, path)
    assert [(e["action"], e["resource"]) for e in rows] == [
        ("bulk_cancel", "activity"),
        ("run_now", "activity"),
        ("update", "activity"),
        ("create", "activity"),
        ("create", "activity"),
        ("create", "activity_type"),
        ("create", "solution"),
    ]
    by_key = {"actor": "api_key", "api_key_id": key["id"], "api_key_name": "partner"}
    assert {k: rows[0][k] for k in by_key} == by_key
    assert rows[0]["details"]["filter"] == {"object_id": "1"}
    assert (rows[0]["details"]["matched"], rows[0]["details"]["changed"]) == (4, 4)
    assert rows[1]["resource_id"] == single["id"] and rows[2]["details"] == {"fields": ["priority"]}
    assert (
        rows[3]["details"] == {"count": 3} and rows[3]["actor"] == "admin" and rows[3]["api_key_id"] is None
    )
    assert rows[4]["resource_id"] == single["id"]
    assert rows[5]["resource_id"] == activity_type["name"] and rows[6]["resource_id"] == solution["name"]
    assert all(e["solution"] == solution["name"] for e in rows)
    assert [e["id"] for e in rows] == sorted((e["id"] for e in rows), reverse=True)

    assert [e["action"] for e in await entries(api, path, action="create", resource="activity")] == [
        "create"
    ] * 2
    company_rows = await entries(api, f"/v1/companies/{company['name']}")
    assert [(e["action"], e["resource"], e["solution"]) for e in company_rows[-2:]] == [
        ("create", "api_key", None),
        ("create", "company", None),
    ]
    assert len(company_rows) == len(rows) + 2
    assert company_rows[-2]["resource_id"] == key["id"] and company_rows[-2]["details"] == {
        "name": "partner",
        "scopes": ["read", "write"],
    }

    # a company key reads its own company only
    other = await api.company()
    other_key = await api.api_key(other["name"])
    for audit in (path, f"/v1/companies/{company['name']}"):
        assert_problem(await api.get(audit + "/audit", token=other_key), 404)
    assert len(await entries(api, path, token=key["key"])) == len(rows)


async def test_bad_audit_filters_are_a_422_naming_the_parameter(sqlite_api: Api) -> None:
    tenant = await sqlite_api.tenant()
    bad = (
        ("resource", "song"),
        ("action", "explode"),
        ("limit", "0"),
        ("cursor", "nope"),
        ("resource_id", "a\x00b"),
    )
    for name, value in bad:
        assert_problem(await sqlite_api.get(tenant.path + "/audit", params={name: value}), 422, name)
