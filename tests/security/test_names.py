"""Names are full-string slugs: a trailing newline is refused, not stored out of every path's reach.

Python's ``re`` lets ``$`` match before a final newline, so ``^[a-z0-9][a-z0-9-]{0,62}$`` accepted
``"acme\\n"`` in the request schemas, and the record it made could not be read, changed or deleted
through any path (``/v1/companies/acme%0A`` is not a slug: 404).

Refusals are sent with the admin token: ``rejected`` compares every row, and a company key's use
may update its ``last_used_at``.
"""

from __future__ import annotations

import pytest

from tests.integration.api.conftest import Api, rejected, unique

NOT_SLUGS = ["acme\n", "acme\r\n", "\nacme", "ac\nme", "acme\x0b"]


@pytest.mark.parametrize("name", NOT_SLUGS, ids=repr)
async def test_a_company_name_with_a_newline_is_refused(api: Api, name: str) -> None:
    await rejected(api, "POST", "/v1/companies", 422, "name", json={"name": name})


@pytest.mark.parametrize("name", NOT_SLUGS, ids=repr)
async def test_solution_and_type_names_with_a_newline_are_refused(api: Api, name: str) -> None:
    tenant = await api.tenant()
    solutions = f"/v1/companies/{tenant.company}/solutions"
    await rejected(api, "POST", solutions, 422, "name", json={"name": name})
    activity_type = {"name": name, "verb": "POST", "uri_pattern": "https://receiver.example/a"}
    await rejected(api, "POST", tenant.types, 422, "name", json=activity_type)


async def test_names_that_refer_to_types_are_full_string_slugs_too(api: Api) -> None:
    tenant = await api.tenant()
    near = tenant.activity_type + "\n"
    activity_type = {"name": unique("t"), "verb": "POST", "uri_pattern": "https://receiver.example/a"}
    for field in ("on_success", "on_dead_letter"):
        body = {**activity_type, field: near}
        await rejected(api, "POST", tenant.types, 422, field, json=body)
    activity = tenant.activity(activity_type=near)
    await rejected(api, "POST", tenant.activities, 422, "activity_type", json=activity)
    batch = {"activities": [tenant.activity(), activity]}
    field = "activities/1/activity_type"
    await rejected(api, "POST", tenant.activities, 422, field, json=batch)


async def test_a_slug_is_still_accepted(api: Api) -> None:
    name = unique("acme")
    created = await api.post("/v1/companies", {"name": name}, expect=201)
    assert created.json()["name"] == name
    await api.delete(f"/v1/companies/{name}", expect=204)
