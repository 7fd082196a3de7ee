"""Companies, API keys and solutions over a real server, on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid

from tests.integration.api.conftest import Api, assert_problem, db_rows, unique


async def test_company_create_read_patch_delete(api: Api) -> None:
    name = unique("acme")
    created = (await api.post("/v1/companies", {"name": name}, expect=201)).json()
    assert created["name"] == name
    assert created["qos_level"] == 1 and created["paused"] is False
    uuid.UUID(created["id"])

    read = (await api.get(f"/v1/companies/{name}", expect=200)).json()
    assert read == created

    patched = (await api.patch(f"/v1/companies/{name}", {"qos_level": 5, "paused": True}, expect=200)).json()
    assert (patched["qos_level"], patched["paused"], patched["id"]) == (5, True, created["id"])
    assert (await api.get(f"/v1/companies/{name}", expect=200)).json() == patched

    await api.delete(f"/v1/companies/{name}", expect=204)
    assert_problem(await api.get(f"/v1/companies/{name}"), 404)
    assert name not in [c["name"] for c in await api.all_items("/v1/companies")]


async def test_company_name_is_unique(api: Api) -> None:
    company = await api.company()
    assert_problem(await api.post("/v1/companies", {"name": company["name"]}), 409)
    assert [c["name"] for c in await api.all_items("/v1/companies")] == [company["name"]]


async def test_companies_page_with_a_cursor_until_it_is_null(api: Api) -> None:
    made = [(await api.company())["id"] for _ in range(5)]
    items, sizes = await api.pages("/v1/companies", limit=2)
    assert sizes == [2, 2, 1]
    assert [c["id"] for c in items] == made  # creation order, nothing repeated or skipped
    items, sizes = await api.pages("/v1/companies", limit=5)
    assert sizes == [5] and [c["id"] for c in items] == made


async def test_delete_company_with_solutions_needs_cascade(api: Api) -> None:
    tenant = await api.tenant()
    activity = (await api.post(tenant.activities, tenant.activity(), expect=201)).json()

    problem = assert_problem(await api.delete(f"/v1/companies/{tenant.company}"), 409)
    assert "cascade=true" in problem["detail"] and "delete" in problem["detail"]
    await api.get(f"/v1/companies/{tenant.company}", expect=200)
    await api.get(f"{tenant.activities}/{activity['id']}", expect=200)

    await api.delete(f"/v1/companies/{tenant.company}", params={"cascade": "true"}, expect=204)
    assert_problem(await api.get(f"/v1/companies/{tenant.company}"), 404)
    assert_problem(await api.get(tenant.activities, token=tenant.key), 401)  # its keys went with it
    for table in ("company", "api_key", "solution", "activity_type", "activity"):
        assert await db_rows(api.database_url, f"SELECT * FROM {table}") == [], table


async def test_delete_company_without_children_needs_no_cascade(api: Api) -> None:
    company = await api.company()
    await api.api_key(company["name"])
    await api.delete(f"/v1/companies/{company['name']}", expect=204)
    assert await db_rows(api.database_url, "SELECT * FROM api_key") == []


async def test_api_key_is_shown_once_and_listed_without_it(api: Api) -> None:
    company = (await api.company())["name"]
    created = await api.post(f"/v1/companies/{company}/api-keys", {"name": "deploy"}, expect=201)
    key = created.json()
    assert key["key"].startswith("oste_") and key["name"] == "deploy" and key["revoked_at"] is None
    assert key["key"].startswith(key["prefix"])

    listed = await api.all_items(f"/v1/companies/{company}/api-keys")
    assert [k["id"] for k in listed] == [key["id"]]
    assert "key" not in listed[0]
    listing = await api.get(f"/v1/companies/{company}/api-keys", expect=200)
    assert key["key"] not in listing.text

    # the key works for its company until it is revoked
    await api.get(f"/v1/companies/{company}", token=key["key"], expect=200)
    await api.delete(f"/v1/companies/{company}/api-keys/{key['id']}", expect=204)
    [revoked] = await api.all_items(f"/v1/companies/{company}/api-keys")
    assert revoked["revoked_at"] is not None
    assert_problem(await api.get(f"/v1/companies/{company}", token=key["key"]), 401)


async def test_api_keys_page_and_unknown_ones_answer_404(api: Api) -> None:
    company = (await api.company())["name"]
    for _ in range(3):
        await api.api_key(company)
    items, sizes = await api.pages(f"/v1/companies/{company}/api-keys", limit=2)
    assert sizes == [2, 1] and len({k["id"] for k in items}) == 3
    base = f"/v1/companies/{company}/api-keys"
    assert_problem(await api.delete(f"{base}/{uuid.uuid4()}"), 404)
    assert_problem(await api.delete(f"{base}/not-a-uuid"), 404)


async def test_solution_create_read_patch_delete(api: Api) -> None:
    company = (await api.company())["name"]
    base = f"/v1/companies/{company}/solutions"
    created = (await api.post(base, {"name": "billing"}, expect=201)).json()
    assert created["name"] == "billing" and created["company"] == company
    assert (created["qos_level"], created["paused"]) == (1, False)
    assert (created["success_period"], created["dead_letter_period"]) == ("P7D", "P30D")
    assert created["success_uri"] is None and created["dead_letter_uri"] is None

    assert (await api.get(f"{base}/billing", expect=200)).json() == created

    changes = {
        "qos_level": 3,
        "success_uri": "https://logs.example/success",
        "success_period": "PT12H",
        "dead_letter_uri": "https://logs.example/dead",
        "dead_letter_period": "P2D",
        "paused": True,
    }
    patched = (await api.patch(f"{base}/billing", changes, expect=200)).json()
    for field, value in changes.items():
        assert patched[field] == value, field
    assert (await api.get(f"{base}/billing", expect=200)).json() == patched

    await api.delete(f"{base}/billing", expect=204)
    assert_problem(await api.get(f"{base}/billing"), 404)
    assert await api.all_items(base) == []


async def test_solution_names_are_unique_within_a_company_only(api: Api) -> None:
    first, second = (await api.company())["name"], (await api.company())["name"]
    await api.post(f"/v1/companies/{first}/solutions", {"name": "shop"}, expect=201)
    assert_problem(await api.post(f"/v1/companies/{first}/solutions", {"name": "shop"}), 409)
    await api.post(f"/v1/companies/{second}/solutions", {"name": "shop"}, expect=201)
    assert len(await api.all_items(f"/v1/companies/{first}/solutions")) == 1


async def test_solutions_page_with_a_cursor(api: Api) -> None:
    company = (await api.company())["name"]
    made = [(await api.solution(company))["id"] for _ in range(3)]
    items, sizes = await api.pages(f"/v1/companies/{company}/solutions", limit=1)
    assert sizes == [1, 1, 1] and [s["id"] for s in items] == made


async def test_rotating_the_signing_secret_replaces_it(api: Api) -> None:
    tenant = await api.tenant()
    before = (await api.get(tenant.path, token=tenant.key, expect=200)).json()["signing_secret"]
    assert before.startswith("whsec_")
    rotated = (await api.post(f"{tenant.path}/rotate-signing-secret", token=tenant.key, expect=200)).json()
    assert rotated["signing_secret"].startswith("whsec_") and rotated["signing_secret"] != before
    after = (await api.get(tenant.path, token=tenant.key, expect=200)).json()
    assert after["signing_secret"] == rotated["signing_secret"]


async def test_delete_solution_with_activity_types_needs_cascade(api: Api) -> None:
    tenant = await api.tenant()
    activity = (await api.post(tenant.activities, tenant.activity(), expect=201)).json()

    problem = assert_problem(await api.delete(tenant.path), 409)
    assert "cascade=true" in problem["detail"]
    await api.get(f"{tenant.activities}/{activity['id']}", expect=200)

    await api.delete(tenant.path, params={"cascade": "true"}, expect=204)
    assert_problem(await api.get(tenant.path), 404)
    for table in ("solution", "activity_type", "activity"):
        assert await db_rows(api.database_url, f"SELECT * FROM {table}") == [], table
    await api.get(f"/v1/companies/{tenant.company}", expect=200)  # the parent stays
