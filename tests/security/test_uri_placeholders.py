"""A URI pattern's placeholder is a plain name: ``{k-}`` was stored (201) although no identifier ends
with a dash. Names are words of letters, digits and ``_`` (the first starting with a letter or ``_``)
joined by single dashes: ``{SongId}``, ``{song-id}``, ``{_v2}``."""

from __future__ import annotations

import pytest

from tests.integration.api.conftest import Api, rejected

BASE = "http://127.0.0.1/"


@pytest.mark.parametrize("name", ["k-", "k--v", "-k", "k_-", "k-é", "", "k v", "1k"])
async def test_a_placeholder_that_is_not_a_plain_name_is_refused(api: Api, name: str) -> None:
    tenant = await api.tenant()
    pattern = BASE + "{" + name + "}"
    body = {"name": "odd", "verb": "POST", "uri_pattern": pattern}
    # the admin token: a company key's first use of the tenant's key would update its last_used_at
    problem = await rejected(api, "POST", tenant.types, 422, "uri_pattern", json=body)
    assert "placeholder" in problem["detail"], problem
    type_path = f"{tenant.types}/{tenant.activity_type}"
    await rejected(api, "PATCH", type_path, 422, "uri_pattern", json={"uri_pattern": pattern})
    bulk = {"filter": {"state": "scheduled"}, "action": "update", "set": {"uri": pattern}}
    path = f"{tenant.activities}/bulk"
    await rejected(api, "POST", path, 422, "set/uri", json=bulk)


@pytest.mark.parametrize("name", ["k", "SongId", "song-id", "a-b-c", "_v2", "k_", "K9-x_1"])
async def test_plain_names_are_placeholders(api: Api, name: str) -> None:
    tenant = await api.tenant()
    body = {"name": "plain", "verb": "POST", "uri_pattern": f"{BASE}a/{{{name}}}"}
    await api.post(tenant.types, body, token=tenant.key, expect=201)
    activity = {"activity_type": "plain", "parameter": {name: "x"}}
    await api.post(tenant.activities, activity, token=tenant.key, expect=201)
