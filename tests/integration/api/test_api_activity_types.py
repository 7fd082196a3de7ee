"""Activity types over a real server, on SQLite and PostgreSQL."""

from __future__ import annotations

from tests.integration.api.conftest import Api, assert_problem, db_rows, rejected, unique

SONG_SCHEMA = {
    "type": "object",
    "properties": {"SongId": {"type": "integer"}, "Album": {"type": "string"}},
    "required": ["SongId"],
}


async def test_activity_type_create_read_patch_delete(api: Api) -> None:
    company = (await api.company())["name"]
    solution = (await api.solution(company))["name"]
    base = f"/v1/companies/{company}/solutions/{solution}/activity-types"
    body = {
        "name": "republish",
        "verb": "PUT",
        "uri_pattern": "https://api.example.com/album/{Album}/song/{SongId}?force={Force}",
        "parameter_schema": SONG_SCHEMA,
        "retries": 5,
        "timeout": "PT45S",
        "object_id_ref": ["Album", "SongId"],
        "headers": {"X-Team": "music"},
        "max_concurrency": 4,
        "rate_limit": 2.5,
        "paused": True,
    }
    created = (await api.post(base, body, expect=201)).json()
    for field in ("name", "verb", "uri_pattern", "parameter_schema", "retries", "timeout", "object_id_ref"):
        assert created[field] == body[field], field
    assert created["headers"] == {"X-Team": {"secret": False, "value": "music"}}
    assert (created["max_concurrency"], created["rate_limit"], created["paused"]) == (4, 2.5, True)
    assert created["solution"] == solution

    assert (await api.get(f"{base}/republish", expect=200)).json() == created

    changes = {"retries": 0, "timeout": "PT2M", "uri_pattern": "https://api.example.com/s/{SongId}"}
    patched = (await api.patch(f"{base}/republish", changes, expect=200)).json()
    assert (patched["retries"], patched["timeout"], patched["uri_pattern"]) == (
        0,
        "PT2M",
        "https://api.example.com/s/{SongId}",
    )
    assert patched["verb"] == "PUT" and patched["parameter_schema"] == SONG_SCHEMA  # untouched
    assert (await api.get(f"{base}/republish", expect=200)).json() == patched

    await api.delete(f"{base}/republish", expect=204)
    assert_problem(await api.get(f"{base}/republish"), 404)
    assert await api.all_items(base) == []


async def test_activity_type_defaults(api: Api) -> None:
    tenant = await api.tenant()
    activity_type = (await api.get(f"{tenant.types}/{tenant.activity_type}", expect=200)).json()
    assert activity_type["retries"] == 3 and activity_type["timeout"] == "PT30S"
    assert (
        activity_type["parameter_schema"] is None
        and activity_type["object_id_ref"] == []
        and activity_type["headers"] == {}
    )
    assert activity_type["paused"] is False


async def test_activity_type_names_are_unique_within_a_solution(api: Api) -> None:
    tenant = await api.tenant()
    body = {"name": tenant.activity_type, "verb": "POST", "uri_pattern": "https://x.example/"}
    assert_problem(await api.post(tenant.types, body), 409)
    assert len(await api.all_items(tenant.types)) == 1


async def test_activity_types_page_with_a_cursor(api: Api) -> None:
    tenant = await api.tenant()
    made = [(await api.get(f"{tenant.types}/{tenant.activity_type}")).json()["id"]]
    made += [(await api.activity_type(tenant.path))["id"] for _ in range(4)]
    items, sizes = await api.pages(tenant.types, limit=2)
    assert sizes == [2, 2, 1] and [t["id"] for t in items] == made


async def test_delete_type_with_scheduled_activities_needs_cascade(api: Api) -> None:
    tenant = await api.tenant()
    activity = (await api.post(tenant.activities, tenant.activity(), expect=201)).json()
    path = f"{tenant.types}/{tenant.activity_type}"

    problem = assert_problem(await api.delete(path), 409)
    assert "cascade=true" in problem["detail"]
    await api.get(path, expect=200)

    await api.delete(path, params={"cascade": "true"}, expect=204)
    assert_problem(await api.get(path), 404)
    assert_problem(await api.get(f"{tenant.activities}/{activity['id']}"), 404)
    assert await db_rows(api.database_url, "SELECT * FROM activity") == []


async def test_delete_type_with_a_recurring_activity_needs_cascade(api: Api) -> None:
    tenant = await api.tenant()
    body = {"activity_type": tenant.activity_type, "schedule": {"cron": "@daily"}, "parameter": {"SongId": 1}}
    recurring = (await api.post(tenant.recurring, body, expect=201)).json()
    path = f"{tenant.types}/{tenant.activity_type}"

    assert_problem(await api.delete(path), 409)
    await api.delete(path, params={"cascade": "true"}, expect=204)
    assert_problem(await api.get(f"{tenant.recurring}/{recurring['id']}"), 404)


async def test_a_type_with_only_finished_activities_deletes_without_cascade(api: Api) -> None:
    tenant = await api.tenant()
    activity = (await api.post(tenant.activities, tenant.activity(), expect=201)).json()
    await api.delete(f"{tenant.activities}/{activity['id']}", expect=200)  # cancel
    await api.delete(f"{tenant.types}/{tenant.activity_type}", expect=204)


async def test_types_of_another_solution_are_not_found(api: Api) -> None:
    tenant = await api.tenant()
    other = await api.solution(tenant.company)
    path = f"/v1/companies/{tenant.company}/solutions/{other['name']}/activity-types/{tenant.activity_type}"
    assert_problem(await api.get(path), 404)
    assert_problem(await api.patch(path, {"retries": 1}), 404)
    assert_problem(await api.delete(path), 404)
    name = unique("missing")
    assert_problem(await api.get(f"{tenant.types}/{name}"), 404)


async def test_a_uri_pattern_needing_a_field_its_schema_forbids_is_refused_naming_both(api: Api) -> None:
    # Issue 39, O12: such a type was accepted, and no activity could ever be created for it.
    company = await api.company()
    solution = await api.solution(company["name"])
    path = f"/v1/companies/{company['name']}/solutions/{solution['name']}/activity-types"
    closed = {"type": "object", "properties": {"Title": {"type": "string"}}, "additionalProperties": False}
    body = {"name": "closed", "verb": "POST", "uri_pattern": "https://r.example/song/{SongId}"}
    problem = await rejected(api, "POST", path, 422, "uri_pattern", json={**body, "parameter_schema": closed})
    assert "parameter_schema" in [error["field"] for error in problem["errors"]], problem
    assert "SongId" in problem["detail"], problem

    forbidden = {"type": "object", "properties": {"SongId": False}}
    await rejected(api, "POST", path, 422, "parameter_schema", json={**body, "parameter_schema": forbidden})

    allowed = {**closed, "properties": {**closed["properties"], "SongId": {"type": "integer"}}}
    await api.post(path, {**body, "parameter_schema": allowed}, expect=201)
    await rejected(api, "PATCH", f"{path}/closed", 422, "parameter_schema", json={"parameter_schema": closed})
