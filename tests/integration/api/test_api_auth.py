"""Authentication and tenant isolation over a real server, on SQLite and PostgreSQL.

A company API key reaches its own company only: another company's resources answer 404 (never 403, so
their existence does not leak), operator-only operations answer 403, and secrets are never echoed.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from oste.operations.throttle import SignInThrottle
from oste.settings import Settings
from tests.integration.api.conftest import Api, Tenant, api_client, assert_problem, db_rows, rejected


@pytest.fixture
async def api(database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    """The suite's server, with room for many wrong tokens from this one client: these tests send a
    revoked key to every route, which the brute-force throttle would soon answer with 429 before
    looking (tests/security/test_brute_force.py tests that)."""
    settings = Settings(data_dir=tmp_path, database_url=database_url)
    async with api_client(settings, throttle=SignInThrottle(burst=10_000)) as client:
        yield client


@dataclass(frozen=True)
class Side:
    """One company's tenant with an activity and a recurring activity in it."""

    tenant: Tenant
    key_id: str
    activity: str  # path
    recurring: str  # path


async def _side(api: Api) -> Side:
    tenant = await api.tenant()
    [key] = await api.all_items(f"/v1/companies/{tenant.company}/api-keys")
    activity = (await api.post(tenant.activities, tenant.activity(delay="PT1H"), expect=201)).json()
    body = {"activity_type": tenant.activity_type, "schedule": {"cron": "@daily"}, "parameter": {"SongId": 1}}
    recurring = (await api.post(tenant.recurring, body, expect=201)).json()
    return Side(
        tenant, key["id"], f"{tenant.activities}/{activity['id']}", f"{tenant.recurring}/{recurring['id']}"
    )


@pytest.fixture
async def sides(api: Api) -> AsyncIterator[tuple[Side, Side]]:
    yield await _side(api), await _side(api)


def every_route(side: Side) -> list[tuple[str, str, Any]]:
    """One request to every company-scoped route of this side: (method, path, body)."""
    t = side.tenant
    company = f"/v1/companies/{t.company}"
    activity_type = f"{t.types}/{t.activity_type}"
    new_type = {"name": "new-type", "verb": "POST", "uri_pattern": "https://x.example/"}
    recurring = {"activity_type": t.activity_type, "schedule": {"cron": "@daily"}, "parameter": {"SongId": 2}}
    return [
        ("GET", company, None),
        ("PATCH", company, {"qos_level": 7}),
        ("DELETE", company + "?cascade=true", None),
        ("GET", f"{company}/api-keys", None),
        ("POST", f"{company}/api-keys", {"name": "stolen"}),
        ("DELETE", f"{company}/api-keys/{side.key_id}", None),
        ("GET", f"{company}/solutions", None),
        ("POST", f"{company}/solutions", {"name": "new-solution"}),
        ("GET", t.path, None),
        ("PATCH", t.path, {"qos_level": 7}),
        ("DELETE", t.path + "?cascade=true", None),
        ("POST", f"{t.path}/rotate-signing-secret", None),
        ("GET", t.types, None),
        ("POST", t.types, new_type),
        ("GET", activity_type, None),
        ("PATCH", activity_type, {"retries": 9}),
        ("DELETE", activity_type + "?cascade=true", None),
        ("GET", t.activities, None),
        ("POST", t.activities, t.activity()),
        ("POST", t.activities, {"activities": [t.activity()]}),
        ("GET", side.activity, None),
        ("PATCH", side.activity, {"priority": 9}),
        ("DELETE", side.activity, None),
        ("GET", f"{side.activity}/executions", None),
        ("GET", t.recurring, None),
        ("POST", t.recurring, recurring),
        ("GET", side.recurring, None),
        ("PATCH", side.recurring, {"priority": 9}),
        ("DELETE", side.recurring, None),
        ("POST", f"{side.recurring}/pause", None),
        ("POST", f"{side.recurring}/resume", None),
    ]


BAD_AUTHORIZATION = {
    "none": None,
    "unknown token": "Bearer not-a-token",
    "unknown key": "Bearer oste_" + "x" * 40,
    "bearer without a token": "Bearer",
    "basic scheme": "Basic YWRtaW46YWRtaW4=",
}


async def test_no_or_bad_token_is_401(api: Api, sides: tuple[Side, Side], subtests: Any) -> None:
    mine, _ = sides
    routes = [*every_route(mine), ("GET", "/v1/companies", None), ("POST", "/v1/companies", {"name": "x"})]
    routes.append(("POST", "/v1/schedule-preview", {"schedule": {"cron": "@daily"}}))
    for method, path, body in routes:  # every route without a token
        with subtests.test("none", method=method, path=path):
            await rejected(api, method, path, 401, json=body, token=None)
    for label, header in BAD_AUTHORIZATION.items():  # every kind of bad token on a read and a write
        for method, path, body in (routes[0], ("POST", mine.tenant.activities, mine.tenant.activity())):
            with subtests.test(label, method=method, path=path):
                headers = {"Authorization": header} if header else {}
                await rejected(api, method, path, 401, json=body, token=None, headers=headers)


async def test_the_admin_token_reaches_every_company(api: Api, sides: tuple[Side, Side]) -> None:
    for side in sides:
        for method, path, _ in every_route(side):
            if method == "GET":
                await api.get(path, expect=200)
    names = [c["name"] for c in await api.all_items("/v1/companies")]
    assert names == [side.tenant.company for side in sides]


async def test_a_company_key_works_in_its_own_company(api: Api, sides: tuple[Side, Side]) -> None:
    mine, _ = sides
    key = mine.tenant.key
    operator_only = ("PATCH", f"/v1/companies/{mine.tenant.company}")
    for method, path, body in every_route(mine):
        if method != "DELETE" and (method, path) != operator_only:
            response = await api.call(method, path, json=body, token=key)
            assert response.status_code in (200, 201), f"{method} {path}: {response.text}"
    preview = {"schedule": {"cron": "@daily"}}
    await api.post("/v1/schedule-preview", preview, token=key, expect=200)
    # deletes last: the activity (cancel), the recurring activity, then a solution of its own
    await api.delete(mine.activity, token=key, expect=200)
    await api.delete(mine.recurring, token=key, expect=204)
    await api.delete(mine.tenant.path, params={"cascade": "true"}, token=key, expect=204)


async def test_another_companys_resources_are_404(api: Api, sides: tuple[Side, Side], subtests: Any) -> None:
    mine, theirs = sides
    for method, path, body in every_route(theirs):
        with subtests.test(method=method, path=path):
            await rejected(api, method, path, 404, json=body, token=mine.tenant.key)
    # their resources named under my own company and solution are not found either
    activity_id = theirs.activity.rsplit("/", 1)[1]
    mixed = [
        f"/v1/companies/{mine.tenant.company}/solutions/{theirs.tenant.solution}",
        f"{mine.tenant.activities}/{activity_id}",
        f"{mine.tenant.types}/{theirs.tenant.activity_type}",
        f"{mine.tenant.recurring}/{theirs.recurring.rsplit('/', 1)[1]}",
    ]
    for path in mixed:
        with subtests.test("mixed", path=path):
            await rejected(api, "GET", path, 404, token=mine.tenant.key)
            await rejected(api, "GET", path, 404)  # the admin too: it is simply not there
    with subtests.test("their key under my company"):
        path = f"/v1/companies/{mine.tenant.company}/api-keys/{theirs.key_id}"
        await rejected(api, "DELETE", path, 404, token=mine.tenant.key)
        await api.get(f"/v1/companies/{theirs.tenant.company}", token=theirs.tenant.key, expect=200)


async def test_another_company_is_indistinguishable_from_a_missing_one(
    api: Api, sides: tuple[Side, Side]
) -> None:
    mine, theirs = sides
    existing = assert_problem(
        await api.get(f"/v1/companies/{theirs.tenant.company}/solutions", token=mine.tenant.key), 404
    )
    missing = assert_problem(await api.get("/v1/companies/no-such-co/solutions", token=mine.tenant.key), 404)
    assert existing["title"] == missing["title"] and existing["type"] == missing["type"]
    assert existing["detail"].replace(theirs.tenant.company, "X") == missing["detail"].replace(
        "no-such-co", "X"
    )


async def test_operator_only_operations_are_403_for_a_company_key(
    api: Api, sides: tuple[Side, Side], subtests: Any
) -> None:
    mine, _ = sides
    company = f"/v1/companies/{mine.tenant.company}"
    for method, path, body in [
        ("GET", "/v1/companies", None),
        ("POST", "/v1/companies", {"name": "by-a-key"}),
        ("PATCH", company, {"qos_level": 1000}),
        ("PATCH", company, {"paused": True}),
        ("DELETE", company, None),
        ("DELETE", company + "?cascade=true", None),
    ]:
        with subtests.test(method=method, path=path):
            problem = await rejected(api, method, path, 403, json=body, token=mine.tenant.key)
            assert "admin" in problem["detail"] or "operator" in problem["detail"]


async def test_a_revoked_key_is_401_and_other_keys_keep_working(api: Api, sides: tuple[Side, Side]) -> None:
    mine, _ = sides
    company = f"/v1/companies/{mine.tenant.company}"
    second = (
        await api.post(
            f"{company}/api-keys",
            {"name": "second", "scopes": ["read", "keys"]},
            token=mine.tenant.key,
            expect=201,
        )
    ).json()
    await api.get(mine.activity, token=second["key"], expect=200)

    await api.delete(f"{company}/api-keys/{mine.key_id}", token=second["key"], expect=204)
    for method, path, body in every_route(mine):
        response = await api.call(method, path, json=body, token=mine.tenant.key)
        assert_problem(response, 401)
    await api.get(mine.activity, token=second["key"], expect=200)

    await api.delete(f"{company}/api-keys/{second['id']}", expect=204)  # the admin revokes too
    assert_problem(await api.get(mine.activity, token=second["key"]), 401)
    await api.delete(f"{company}/api-keys/{second['id']}", expect=204)  # revoking again is harmless


async def test_the_signing_secret_is_shown_to_its_company_only(api: Api, sides: tuple[Side, Side]) -> None:
    mine, _ = sides
    key = mine.tenant.key
    solutions = f"/v1/companies/{mine.tenant.company}/solutions"

    own = (await api.get(mine.tenant.path, token=key, expect=200)).json()
    secret = own["signing_secret"]
    assert secret.startswith("whsec_")
    [listed] = await api.all_items(solutions, token=key)
    assert listed["signing_secret"] == secret
    patched = (await api.patch(mine.tenant.path, {"qos_level": 2}, token=key, expect=200)).json()
    assert patched["signing_secret"] == secret
    created = (await api.post(solutions, {"name": "second"}, token=key, expect=201)).json()
    assert created["signing_secret"].startswith("whsec_")

    for response in (
        await api.get(mine.tenant.path, expect=200),
        await api.get(solutions, expect=200),
        await api.patch(mine.tenant.path, {"qos_level": 3}, expect=200),
        await api.post(solutions, {"name": "by-admin"}, expect=201),
        await api.post(f"{mine.tenant.path}/rotate-signing-secret", expect=200),
    ):
        answer = response.json()
        for item in answer.get("items", [answer]):
            assert not {"signing_secret", "previous_signing_secret"} & set(item), response.text
        assert "whsec_" not in response.text, response.text
    rotated = (await api.get(mine.tenant.path, token=key, expect=200)).json()["signing_secret"]
    assert rotated != secret  # the admin's rotation took effect, unseen by the admin


async def test_secret_header_values_are_never_echoed(api: Api, sides: tuple[Side, Side]) -> None:
    mine, _ = sides
    key = mine.tenant.key
    body = {
        "name": "with-secrets",
        "verb": "POST",
        "uri_pattern": "https://x.example/{SongId}",
        "headers": {"X-Api-Key": {"value": "s3cr3t-value", "secret": True}, "X-Team": "music"},
    }
    path = f"{mine.tenant.types}/with-secrets"
    responses = [
        await api.post(mine.tenant.types, body, token=key, expect=201),
        await api.get(path, token=key, expect=200),
        await api.get(path, expect=200),
        await api.get(mine.tenant.types, token=key, expect=200),
        await api.patch(path, {"retries": 1}, token=key, expect=200),
    ]
    for response in responses:
        assert "s3cr3t-value" not in response.text
    shown = responses[1].json()["headers"]
    assert shown == {"X-Api-Key": {"secret": True}, "X-Team": {"secret": False, "value": "music"}}

    new_headers = {"headers": {"X-Api-Key": {"value": "rotated-s3cr3t", "secret": True}}}
    patched = await api.patch(path, new_headers, token=key, expect=200)
    assert "rotated-s3cr3t" not in patched.text
    assert patched.json()["headers"] == {"X-Api-Key": {"secret": True}}


async def test_api_keys_are_stored_only_as_hashes(api: Api, sides: tuple[Side, Side]) -> None:
    keys = [side.tenant.key for side in sides]
    rows = await db_rows(api.database_url, "SELECT * FROM api_key")
    assert len(rows) == 2
    stored = " ".join(str(value) for row in rows for value in row.values())
    for key in keys:
        assert key not in stored
        assert key[len("oste_") :] not in stored
    assert {row["key_hash"] for row in rows} == {hashlib.sha256(k.encode()).hexdigest() for k in keys}
